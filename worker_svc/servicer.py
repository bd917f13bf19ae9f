"""The worker's gRPC service: Describe, the Step stream, LoRA adapters (lora/loading.py),
and KV that moves between workers (kv_transfer/: SendKv, ReceiveKv).

A big plan runs on one dedicated forward thread, so that stream reads and health checks
are answered during a long prefill; a small one with nothing before it runs on the
loop's own thread (step_placement.py). The runner is never used by both at once.

A new Step stream supersedes the previous one: the runner is reset, and the
old stream is ended with ABORTED as soon as it is not in the middle of a step.
A stream that ends (the scheduler closed it, or died) drops the runner's state
too, so that a worker without a scheduler holds nothing and waits for the next.

Draining (server.py, on SIGTERM) refuses new streams with UNAVAILABLE and gives
the open one a grace period to be closed by its scheduler; past that it ends with
UNAVAILABLE after the step in flight.

A message that carries deferred masks (worker.proto's deferred_allowed_tokens) is no
plan: it goes to the runner's mailbox at once, where the sampler of its step waits
(step/deferred_masks.py), and gets no result.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2, worker_pb2_grpc
from worker_svc.errors import PlanError
from worker_svc.kv_transfer.receiver import KvReceiver
from worker_svc.kv_transfer.sender import KvSender
from worker_svc.lora.loading import AdapterService
from worker_svc.metrics import WorkerMetrics
from worker_svc.step_placement import (
    MAX_QUEUED_PLANS,
    overlaps_step_io,
    plans_not_run,
    runs_inline,
)

if TYPE_CHECKING:
    from worker_svc.worker import Worker

# Named as before the service had a file of its own, so that log queries for the
# stream's events (step_stream_opened, plan_rejected, ...) keep finding them.
log = structlog.get_logger("worker_svc.server")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


class _Superseded(Exception):
    pass


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, metrics: WorkerMetrics, kv_transfer_shm: bool = True) -> None:
        self.metrics = metrics
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        # Held by every step, wherever it runs, and by a LoRA slot's write (lora/loading.py).
        self.runner_lock = threading.Lock()
        self.adapters = AdapterService(self.executor, self.runner_lock)
        # KV copies run beside the steps, without the lock (kv_transfer/ says why).
        self.kv_sender = KvSender(shm=kv_transfer_shm)
        self.kv_receiver = KvReceiver(shm=kv_transfer_shm)
        self._worker: Worker | None = None
        # Event-loop side: the newest stream's number and its "superseded" signal.
        self._latest_stream = 0
        self._superseded: asyncio.Event | None = None
        # Forward-thread side: the stream the runner's state belongs to.
        self._runner_stream = 0
        self._open_streams = 0
        self._no_stream = asyncio.Event()
        self._no_stream.set()
        self._draining = False
        self._closing = False
        self.overlap_io = False  # set_ready: whether inline steps overlap the stream's I/O

    async def drain(self, grace_s: float) -> None:
        """Refuses new streams; gives the open one grace_s to end, then ends it
        after its step in flight and waits (briefly) for that."""
        self._draining = True
        try:
            await asyncio.wait_for(self._no_stream.wait(), grace_s)
            return
        except asyncio.TimeoutError:
            pass
        self._closing = True
        if self._superseded is not None:
            self._superseded.set()
        try:
            # A step in flight finishes first; the forward pass is not interrupted.
            await asyncio.wait_for(self._no_stream.wait(), 30.0)
        except asyncio.TimeoutError:
            log.warning("step_stream_not_closed")

    def set_ready(self, worker: Worker) -> None:
        self._worker = worker
        self.overlap_io = overlaps_step_io(worker.threads, worker.description.device)
        log.info("step_io", overlap=self.overlap_io, threads=worker.threads)
        worker.runner.before_step = self.kv_receiver.landings.take_step_blocks

    async def _require_worker(self, context: grpc.aio.ServicerContext) -> Worker:
        if self._worker is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is still loading its model")
        return self._worker

    async def Describe(self, request, context):  # noqa: N802 (gRPC method name)
        return (await self._require_worker(context)).description

    async def LoadAdapter(self, request, context):  # noqa: N802 (gRPC method name)
        return await self.adapters.load(await self._require_worker(context), request, context)

    async def UnloadAdapter(self, request, context):  # noqa: N802 (gRPC method name)
        return await self.adapters.unload(await self._require_worker(context), request, context)

    async def SendKv(self, request, context):  # noqa: N802 (gRPC method name)
        worker = await self._require_worker(context)
        return await self.kv_sender.send(worker.runner.pool, request, context)

    async def ReceiveKv(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        worker = await self._require_worker(context)
        return await self.kv_receiver.receive(worker.runner.pool, request_iterator, context)

    async def Step(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[worker_pb2.StepPlan], context
    ) -> AsyncIterator[worker_pb2.StepResult]:
        worker = await self._require_worker(context)
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        loop = asyncio.get_running_loop()
        self._latest_stream += 1
        stream = self._latest_stream
        if self._superseded is not None:
            self._superseded.set()
        superseded = self._superseded = asyncio.Event()
        self._open_streams += 1
        self._no_stream.clear()
        try:
            await loop.run_in_executor(self.executor, self._reset, worker, stream)
            log.info("step_stream_opened", stream=stream, peer=context.peer())
            async for result in self._serve_stream(
                worker, stream, superseded, request_iterator, context
            ):
                yield result
        finally:
            self._open_streams -= 1
            if self._open_streams == 0:
                self._no_stream.set()
            if stream == self._latest_stream:
                # No scheduler holds this state any more: free it now, not at the
                # next stream. Queued on the forward thread, after any step in flight.
                with contextlib.suppress(RuntimeError):  # the executor is shut down
                    self.executor.submit(self._drop, worker, stream)

    async def _serve_stream(self, worker, stream, superseded, request_iterator, context):
        """Executes the stream's plans in order and yields their results.

        A plan that arrives while the one before it runs is queued on the forward
        thread at once (the scheduler sends step N+1 while N runs: async scheduling),
        so the thread starts it the moment N ends instead of waiting for this loop to
        write N's result and read the next plan. At most one plan waits so.

        A plan that runs on the loop (runs_inline) runs at once, or, where the step
        leaves a core to grpc's threads (overlap_io), from a callback after this
        generator has posted the read of the plan after it and handed the result before
        it to grpc: both then travel while the step holds the loop (step_placement.py).
        """
        loop = asyncio.get_running_loop()
        plans = request_iterator.__aiter__()
        superseded_wait = asyncio.ensure_future(superseded.wait())
        next_plan: asyncio.Future | None = None
        queued: deque[tuple[worker_pb2.StepPlan, asyncio.Future]] = deque()
        ended = False

        def read_next_plan() -> asyncio.Future:
            # The task's first step (which posts the receive to grpc's core) is queued
            # now, so it runs before any step queued after it.
            read = asyncio.ensure_future(plans.__anext__())
            # The read may end (e.g. StopAsyncIteration at shutdown) after this
            # handler stopped looking; mark its outcome seen so asyncio stays quiet.
            read.add_done_callback(_mark_retrieved)
            return read

        try:
            while True:
                if next_plan is None and not ended and self._plans_ahead(queued) < MAX_QUEUED_PLANS:
                    next_plan = read_next_plan()
                waits = {superseded_wait, *([next_plan] if next_plan else [])}
                if queued:
                    waits.add(queued[0][1])
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if superseded.is_set():
                    if next_plan is not None:
                        next_plan.cancel()
                    await self._abort_superseded(context, stream)
                if next_plan is not None and next_plan.done():
                    read, next_plan = next_plan, None
                    try:
                        plan = read.result()
                    except StopAsyncIteration:
                        ended = True
                    else:
                        ahead = self._plans_ahead(queued)  # now: a step may have run
                        if plan.HasField("deferred_allowed_tokens"):
                            # Masks for a plan queued or running: its sampler may wait
                            # on them now, so they go straight to it (no result).
                            worker.runner.mailbox.post(stream, plan)
                        elif runs_inline(plan, ahead) and not self._moving_kv():
                            future = loop.create_future()
                            queued.append((plan, future))
                            if not self.overlap_io:
                                self._execute_inline(worker, stream, superseded, plan, future)
                            else:
                                if ahead + 1 < MAX_QUEUED_PLANS:
                                    next_plan = read_next_plan()
                                loop.call_soon(
                                    self._execute_inline, worker, stream, superseded, plan, future
                                )
                        else:
                            future = loop.run_in_executor(
                                self.executor, self._execute, worker, stream, plan
                            )
                            queued.append((plan, future))
                if queued and queued[0][1].done():
                    plan, future = queued.popleft()
                    result = await self._result_or_abort(context, stream, plan, future)
                    self.metrics.observe_step(result)
                    yield result
                if ended and not queued:
                    log.info("step_stream_closed", stream=stream)
                    return
        finally:
            superseded_wait.cancel()
            if next_plan is not None:
                next_plan.cancel()
            for _, future in queued:
                future.cancel()

    def _plans_ahead(self, queued) -> int:
        """The plans that hold the next one back (from running inline, and from being
        read past MAX_QUEUED_PLANS). Serial: every plan whose result is not yet written,
        since a step run at once would hold that result back a whole step. Overlapped:
        only the plans not yet run, since results go to grpc before a step's callback."""
        return plans_not_run(queued) if self.overlap_io else len(queued)

    def _moving_kv(self) -> bool:
        """A KV transfer in or out needs this loop for each chunk: no step runs on it then."""
        return self.kv_sender.active > 0 or self.kv_receiver.active > 0

    async def _result_or_abort(self, context, stream: int, plan, future: asyncio.Future):
        """The executed plan's result; a refused or failed plan ends the stream."""
        try:
            return future.result()
        except _Superseded:
            await self._abort_superseded(context, stream)
        except PlanError as exc:
            self.metrics.steps_failed.inc()
            log.warning("plan_rejected", stream=stream, step_id=plan.step_id, error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            self.metrics.steps_failed.inc()
            log.exception("step_failed", stream=stream, step_id=plan.step_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"step failed: {exc!r}")

    async def _abort_superseded(self, context, stream: int) -> None:
        if self._closing:
            log.info("step_stream_closed_at_shutdown", stream=stream)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        log.info("step_stream_superseded", stream=stream)
        await context.abort(grpc.StatusCode.ABORTED, "superseded by a newer Step stream")

    # Run on the forward thread only.
    def _reset(self, worker: Worker, stream: int) -> None:
        worker.runner.reset()
        worker.runner.mailbox.reset(stream)
        self._runner_stream = stream

    def _drop(self, worker: Worker, stream: int) -> None:
        if stream == self._runner_stream:
            worker.runner.reset()
            log.info("step_stream_state_dropped", stream=stream)

    def _execute_inline(
        self, worker: Worker, stream: int, superseded: asyncio.Event, plan, future
    ) -> None:
        """The plan run on the loop's thread (at once, or from the callback _serve_stream
        queued): its result or error into `future`, as the forward thread's would be. Only
        when no plan of this stream is on the forward thread (runs_inline), and never beside
        a newer stream's reset there: that stream sets this one's superseded signal (on
        this thread) before it queues the reset, and the signal is read here first. So the
        runner is never used by two threads at once."""
        if future.done():  # cancelled: the stream ended before its turn
            return
        try:
            if superseded.is_set():
                raise _Superseded
            future.set_result(self._execute(worker, stream, plan))
        except Exception as exc:  # noqa: BLE001 (handed on: _result_or_abort reads it)
            future.set_exception(exc)

    # Run on the forward thread, or on the loop's when nothing waits there (runs_inline).
    def _execute(
        self, worker: Worker, stream: int, plan: worker_pb2.StepPlan
    ) -> worker_pb2.StepResult:
        if stream != self._runner_stream:
            raise _Superseded
        with self.runner_lock:
            return worker.runner.execute(plan)


def _mark_retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
