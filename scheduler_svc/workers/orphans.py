"""Requests with no worker: those of a lost worker, and new ones while none is connected.

Each waits here (holding its client's handle, so a cancel still reaches it)
until a connected worker can hold it, then is queued on the least loaded such
worker, where it is prefilled over its prompt and output so far and goes on
where it stopped: its client sees no token twice and none lost. It waits until
its own deadline (then DEADLINE_EXCEEDED) or, without one, for
--worker-wait-timeout (then UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import grpc
import structlog

from common.errors import ServiceError
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import Migrant
from scheduler_svc.workers.placement import pick_for_resume

log = structlog.get_logger("scheduler.orphans")


class Orphanage:
    # What a waiting request's handle reports as its worker.
    address = "(waiting for a worker)"

    def __init__(
        self,
        worker_wait_timeout_s: float,
        connected_engines: Callable[[], Sequence[WorkerEngine]],
    ) -> None:
        self.worker_wait_timeout_s = worker_wait_timeout_s
        self._connected_engines = connected_engines
        self._waiting: dict[str, Migrant] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def take_in(self, migrants: Sequence[Migrant]) -> None:
        """Holds the requests until a worker can take them, and tries to place them now."""
        for migrant in migrants:
            migrant.handle.holder = self
            self._waiting[migrant.request.request_id] = migrant
        self.place()

    def place(self) -> None:
        """Queues every waiting request that some connected worker can hold (call on connect)."""
        engines = self._connected_engines()
        for request_id, migrant in list(self._waiting.items()):
            engine = pick_for_resume(engines, migrant.request.max_kv_tokens)
            if engine is None:
                continue
            del self._waiting[request_id]
            try:
                engine.adopt(migrant)
            except ServiceError as error:
                migrant.handle.fail(error)
                continue
            log.info(
                "request resumed on another worker",
                request_id=request_id,
                worker=engine.address,
                output_tokens=migrant.request.num_output_tokens,
            )
        self._arm_timer()

    def abort_local(self, request_id: str) -> bool:
        """The client of a waiting request is gone (its handle's holder is this)."""
        if self._waiting.pop(request_id, None) is None:
            return False
        self._arm_timer()
        return True

    def fail_all(self, error: ServiceError) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for migrant in self._waiting.values():
            migrant.handle.fail(error)
        self._waiting.clear()

    def _gives_up_at(self, migrant: Migrant) -> float:
        deadline = migrant.request.deadline
        if deadline is not None:
            return deadline
        return migrant.lost_at + self.worker_wait_timeout_s

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        first = min(self._gives_up_at(migrant) for migrant in self._waiting.values())
        delay = max(0.0, first - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        timeout = self.worker_wait_timeout_s
        for request_id, migrant in list(self._waiting.items()):
            if self._gives_up_at(migrant) > now:
                continue
            del self._waiting[request_id]
            if migrant.request.deadline is not None:
                error = ServiceError(
                    "no worker could take it before its deadline (all were lost)",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
            else:
                error = ServiceError(
                    f"no worker could take it within {timeout:g} s (--worker-wait-timeout; "
                    "a request with a deadline waits until its deadline); retry the request",
                    grpc.StatusCode.UNAVAILABLE,
                )
            migrant.handle.fail(error)
        self._arm_timer()
