"""Rebalance (issue 46): a worker that must preempt moves the victim, with its KV, to a
worker with room instead. The rule is core/rebalance.py's; the move kv_moves.py's.

One EngineMover per engine, put on each Scheduler the engine builds (the admission
queue's `mover`). Its `offer` runs inside schedule(): it decides at once, parks the
request there (engine_moves.park_now: no plan from now on includes it, so it takes
no block any more, which is what the preemption was for) and starts the move as a
task beside the step loops: neither engine waits for the transfer. When the move
ends (moved; or recomputed elsewhere when the destination had no room by then or
the transfer failed; or gone: the request finished in the plan in flight) its blocks
are back on the source, whose loop is woken for the requests waiting for them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from scheduler_svc.core.rebalance import RebalanceRule, has_room
from scheduler_svc.core.request import Request

if TYPE_CHECKING:
    from scheduler_svc.kv_metrics import KvTransferMetrics
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.kv_moves import KvMoves
    from scheduler_svc.workers.pool_view import PoolView

log = structlog.get_logger("scheduler.rebalance")

# Requests moved off one worker by rebalance lately, for RebalanceRule.max_per_request
# (counted per source: a request leaves each worker by rebalance at most that often); a
# request long gone falls out.
REMEMBERED_MOVES = 4096


class MoveCounts:
    """How often each recent request was moved off one worker by rebalance."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, int] = OrderedDict()

    def __getitem__(self, request_id: str) -> int:
        return self._counts.get(request_id, 0)

    def add(self, request_id: str) -> None:
        self._counts[request_id] = self[request_id] + 1
        self._counts.move_to_end(request_id)
        while len(self._counts) > REMEMBERED_MOVES:
            self._counts.popitem(last=False)


def mover_for(engine: WorkerEngine, pool: PoolView) -> EngineMover | None:
    """The engine's mover in the pool: to the decode workers, with the pool's metrics;
    None with --no-kv-rebalance (the engine preempts)."""
    if not pool.config.kv_rebalance:
        return None
    metrics = getattr(pool.metrics, "kv_transfers", None)
    return EngineMover(engine, pool.split.decode_engines, lambda: pool.kv_moves, metrics)


class EngineMover:
    """The would-be victims of one engine's preemptions, moved instead where they can."""

    def __init__(
        self,
        engine: WorkerEngine,
        destinations: Callable[[], Sequence[WorkerEngine]],
        moves: Callable[[], KvMoves],
        metrics: KvTransferMetrics | None = None,
        rule: RebalanceRule | None = None,
    ) -> None:
        self.engine = engine
        self._destinations = destinations
        self._moves = moves
        self._counts = MoveCounts()
        self._metrics = metrics
        self.rule = rule if rule is not None else RebalanceRule()
        # Requests being moved off this engine, and their tasks (kept: asyncio holds
        # only weak references to tasks).
        self._tasks: dict[str, asyncio.Task] = {}

    def moving(self) -> bool:
        return bool(self._tasks)

    def offer(self, request: Request) -> bool:
        engine, scheduler = self.engine, self.engine.scheduler
        if scheduler is None or engine.draining or not engine.connected:
            return False
        if len(self._tasks) >= self.rule.max_per_worker:
            return False
        if self._counts[request.request_id] >= self.rule.max_per_request:
            return False
        if not self.rule.worth_moving(scheduler, request):
            return False
        candidates = [
            other
            for other in self._destinations()
            if other is not engine
            and other.connected
            and not other.draining
            and other.scheduler is not None
            and has_room(other.scheduler, request)
        ]
        if not candidates or not engine.park_now(request.request_id):
            return False
        self._counts.add(request.request_id)
        task = asyncio.get_running_loop().create_task(
            self._move(request.request_id, candidates), name=f"rebalance {request.request_id}"
        )
        self._tasks[request.request_id] = task
        log.info(
            "moving a request instead of preempting it",
            request_id=request.request_id,
            source=engine.address,
            tokens=request.num_computed_tokens,
        )
        return True

    async def _move(self, request_id: str, candidates: list[WorkerEngine]) -> None:
        try:
            result = await self._moves().move(self.engine, request_id, candidates)
            if self._metrics is not None:
                self._metrics.rebalanced(result.outcome.value)
        except Exception as error:  # never let a move's bug stop the source's requests
            log.error("rebalance move failed", request_id=request_id, error=repr(error))
        finally:
            self._tasks.pop(request_id, None)
            self.engine.wake()  # its blocks are back (release_hold): waiters may go on
