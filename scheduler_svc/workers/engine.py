"""The step loop for one worker: schedule(), step on the worker, postprocess.

One WorkerEngine per worker connection, each with its own Scheduler and block
manager, all on the scheduler process's single event loop. RPC handlers add
and abort requests between steps; every request's outputs go to its own
asyncio.Queue, which its Generate handler drains.

The pool reads an engine (engine_view) to place requests and is told when its
connection comes or goes (on_connection_change): health status follows it.

A lost worker (see liveness: its stream broke, a keepalive ping or a step
went unanswered; idle or not) loses nothing: it is marked disconnected the
moment it is found, so that nothing new is placed on it; its unfinished
requests are taken out of its Scheduler as Migrants (request with its output
so far, output processor, the client's handle) and handed to on_requests_lost
(the pool's orphanage), which queues them on another worker's engine (adopt)
where they are prefilled over prompt + output and go on where they stopped:
the client sees no token twice and none lost. Then the engine reconnects with
backoff (a flapping worker is held out longer) and serves again from an empty
state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import structlog

from common.errors import ServiceError
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.core.plan import StepPlan
from scheduler_svc.core.request import Request, RequestOutput
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.workers.client import WorkerClient, WorkerLost
from scheduler_svc.workers.engine_view import EngineView
from scheduler_svc.workers.handle import Migrant, RequestHandle
from scheduler_svc.workers.liveness import Comeback, LossCause, keep_trying

if TYPE_CHECKING:
    from scheduler_svc.metrics import SchedulerMetrics

log = structlog.get_logger("scheduler.engine")


@dataclass
class _SentStep:
    plan: StepPlan
    answer: asyncio.Future  # completed by the client's stream reader
    sent_at: float


# One reconnect attempt's wait (the channel retries within it; keep_trying spaces them).
RECONNECT_ATTEMPT_S = 2.0


class WorkerEngine(EngineView):
    def __init__(
        self,
        address: str,
        config: SchedulerConfig,
        tokenizer: Tokenizer,
        *,
        metrics: SchedulerMetrics | None = None,
        on_connection_change: Callable[[WorkerEngine], None] | None = None,
        faults: FaultConfig | None = None,
        on_requests_lost: Callable[[list[Migrant]], None] | None = None,
    ) -> None:
        self.address = address
        self.faults = faults if faults is not None else FaultConfig()
        self.on_requests_lost = on_requests_lost  # None: they end with UNAVAILABLE
        self.config = config
        self.tokenizer = tokenizer
        self.client = WorkerClient(address, self.faults.worker_timeout_s, self._worker_lost)
        self._comeback = Comeback()
        self.scheduler: Scheduler | None = None
        self.steps = 0
        # Requests ever placed here: the last tie-break of placement, so that
        # equal workers take turns, and a per-worker metric.
        self.num_submitted = 0
        # Counters that survive the scheduler being rebuilt after a reconnect.
        self.stats = SchedulerStats()
        self._metrics = metrics
        self._on_connection_change = on_connection_change
        self._connected = False
        # The requests this engine holds, by id: their clients' streams.
        self._handles: dict[str, RequestHandle] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    def _set_connected(self, connected: bool) -> None:
        if connected != self._connected:
            self._connected = connected
            if self._on_connection_change is not None:
                self._on_connection_change(self)

    def adopt(self, migrant: Migrant) -> None:
        """Queues a request from a lost worker; its client's stream goes on from here."""
        request = migrant.request
        if not self.connected or self.scheduler is None:
            raise ServiceError(
                f"worker {self.address} is not connected", grpc.StatusCode.UNAVAILABLE
            )
        try:
            self.scheduler.adopt(request, migrant.processor)
        except ValueError as error:
            raise ServiceError(str(error), grpc.StatusCode.UNAVAILABLE) from error
        migrant.handle.holder = self
        self._handles[request.request_id] = migrant.handle
        self._wakeup.set()

    async def start(self, connect_timeout_s: float) -> None:
        """Connects (raising WorkerLost after the timeout) and starts the loop."""
        await self.client.connect(connect_timeout_s)
        self._reset_scheduler()
        self._task = asyncio.create_task(self._run(), name=f"engine {self.address}")

    def _worker_lost(self, error: WorkerLost) -> None:
        """The client found the worker lost (maybe while this engine idles): place
        nothing more here, and wake the loop to recover."""
        self._set_connected(False)
        self._wakeup.set()

    def _reset_scheduler(self) -> None:
        description = self.client.description
        self.scheduler = Scheduler(
            self.config,
            num_blocks=description.num_kv_blocks,
            block_size=description.block_size,
            max_model_len=description.max_model_len,
            tokenizer=self.tokenizer,
            eos_token_ids=self.tokenizer.eos_token_ids,
            stats=self.stats,
            max_in_flight=self.config.max_steps_in_flight,
        )
        self._set_connected(True)
        self._comeback.connected()

    def submit(self, request: Request) -> RequestHandle:
        """Queues a new request; its client streams from the handle."""
        if not self.connected or self.scheduler is None:
            raise ServiceError(
                f"worker {self.address} is not connected", grpc.StatusCode.UNAVAILABLE
            )
        try:
            self.scheduler.add_request(request)
        except ValueError as error:
            # Validation makes this unreachable for well-formed requests; keep
            # the engine alive and tell the client if it ever happens.
            raise ServiceError(str(error), grpc.StatusCode.INVALID_ARGUMENT) from error
        handle = RequestHandle(request.request_id, self)
        self._handles[request.request_id] = handle
        self.num_submitted += 1
        self._wakeup.set()
        return handle

    def abort_local(self, request_id: str) -> bool:
        """Aborts the request if this engine holds it (its blocks are freed at the next
        step); whether it did."""
        if self._handles.pop(request_id, None) is None:
            return False
        if self.scheduler is not None:
            self.scheduler.abort_request(request_id)
            self._wakeup.set()
        return True

    async def stop(self) -> None:
        """Stops the loop and closes the stream; requests still here end with UNAVAILABLE,
        as when a worker is lost (the pool stops an engine whose worker left DNS)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.client.close()
        self._fail_all(f"worker {self.address} was removed from the pool")
        self._set_connected(False)

    async def _run(self) -> None:
        while True:
            try:
                await self._serve()
            except WorkerLost as error:
                await self._recover(error)

    async def _serve(self) -> None:
        """Steps while the worker answers; raises WorkerLost when it is lost.

        schedule(), run on the worker, postprocess, as one iteration; with async
        scheduling the next plan is built and sent before the result of the one the
        worker is running is read, so the worker finds its next step waiting.
        """
        in_flight: deque[_SentStep] = deque()
        last_result_at = time.monotonic()
        while True:
            self.client.raise_if_lost()
            if len(in_flight) < self.scheduler.max_in_flight:
                plan = self.scheduler.schedule()
                self._deliver_failures()
                if plan is not None:
                    self._note_first_scheduled(plan)
                    sent_at = time.monotonic()
                    in_flight.append(_SentStep(plan, await self.client.send(plan), sent_at))
                    continue  # plan the next one while this one runs
            if not in_flight:
                self._wakeup.clear()
                await self._sleep_until_woken_or(self._next_deadline())
                continue
            sent = in_flight.popleft()
            deadline_s = self.faults.step_deadline_s(sent.plan.num_scheduled_tokens)
            result = await self.client.result(sent.plan, sent.answer, deadline_s)
            answered_at = time.monotonic()
            try:
                outputs = self.scheduler.update_from_output(sent.plan, result)
            except RuntimeError as error:
                # The worker broke the protocol: its state cannot be trusted.
                raise WorkerLost(f"protocol error: {error}", LossCause.PROTOCOL) from error
            self.steps += 1
            for output in outputs:
                self._deliver(output)
            self._deliver_failures()
            if self._metrics is not None:
                # The step's own time starts when the worker could start it: when it was
                # sent, or when the step before it answered, whichever is later.
                step_s = answered_at - max(sent.sent_at, last_result_at)
                total_s = time.monotonic() - last_result_at
                self._metrics.observe_iteration(
                    self.address, step_s, result.forward_seconds, total_s
                )
            last_result_at = answered_at

    def _note_first_scheduled(self, plan) -> None:
        if not plan.new_sequences:
            return
        # A preempted request comes back as a new sequence: keep the first time.
        now = time.monotonic()
        new_seq_ids = {sequence.seq_id for sequence in plan.new_sequences}
        for request in self.scheduler.running:
            handle = self._handles.get(request.request_id)
            if request.seq_id in new_seq_ids and handle and handle.first_scheduled is None:
                handle.first_scheduled = now

    async def _sleep_until_woken_or(self, deadline: float | None) -> None:
        """Idle until a request arrives or leaves, or a queued request's deadline passes."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        # asyncio.TimeoutError: what wait_for raises on Python 3.10 (an alias of
        # TimeoutError only from 3.11 on).
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _deliver_failures(self) -> None:
        """Ends the streams of requests the scheduler failed (deadline, pool too small)."""
        for request in self.scheduler.take_failed():
            handle = self._handles.pop(request.request_id, None)
            if handle is not None:
                handle.fail(ServiceError(request.error.message, request.error.code))

    def _deliver(self, output: RequestOutput) -> None:
        handle = self._handles.get(output.request_id)
        if handle is None:
            return  # aborted while its step was in flight
        handle.queue.put_nowait(output)
        if output.finish_reason is not None:
            del self._handles[output.request_id]

    async def _recover(self, error: WorkerLost) -> None:
        """Hands the worker's unfinished requests to the pool, then reconnects with backoff.

        The old stream is given up first (nothing read from it counts any more);
        the reconnected worker starts from an empty state: a new stream resets it.
        """
        self._set_connected(False)
        hold_out_s = self._comeback.lost()
        log.error(
            "worker lost",
            worker=self.address,
            cause=error.cause.value,
            error=str(error),
            requests=len(self._handles),
            reconnect_in_s=hold_out_s,
            quick_losses=self._comeback.quick_losses,
        )
        if self._metrics is not None:
            self._metrics.observe_worker_lost(error.cause.value, len(self._handles))
        await self.client.close()
        if self.on_requests_lost is None:
            self._fail_all(f"worker {self.address} failed mid-request ({error})")
        else:
            self.on_requests_lost(self.take_migrants())
        await asyncio.sleep(hold_out_s)
        attempts = await keep_trying(lambda: self.client.connect(RECONNECT_ATTEMPT_S))
        self._reset_scheduler()
        log.info(
            "worker reconnected",
            worker=self.address,
            attempts=attempts,
            instance_id=self.client.description.instance_id,
        )

    def take_migrants(self) -> list[Migrant]:
        """Empties the engine of its unfinished requests, to be resumed elsewhere."""
        if self.scheduler is None:
            return []
        self._deliver_failures()
        now = time.monotonic()
        migrants = []
        for request, processor in self.scheduler.take_unfinished():
            handle = self._handles.pop(request.request_id, None)
            if handle is None:
                continue  # its client is gone
            migrants.append(Migrant(request, processor, handle, now))
        # Any queue left has no request behind it any more (cannot happen; never hang one).
        self._fail_all(f"worker {self.address} was lost")
        return migrants

    def _fail_all(self, reason: str) -> None:
        failure = ServiceError(f"{reason}; retry the request", grpc.StatusCode.UNAVAILABLE)
        for handle in self._handles.values():
            handle.fail(failure)
        self._handles.clear()
