"""One worker as the scheduler process holds it: its connection, its Scheduler, the
requests placed on it, and what happens when it is lost.

One WorkerEngine per worker connection, each with its own Scheduler and block
manager, all on the scheduler process's single event loop. The iterations
themselves are step_loop.StepLoop's. RPC handlers add and abort requests
between steps; every request's outputs go to its own asyncio.Queue (handle.py),
which its Generate handler drains.

The pool reads an engine's plain properties (load, pool, cache:
engine_readings.py) to place requests and is told when its connection comes or
goes (on_connection_change): health status follows it.

A lost worker (see liveness: its stream broke, a keepalive ping or a step
went unanswered; idle or not) loses nothing: it is marked disconnected the
moment it is found, so that nothing new is placed on it; its unfinished
requests are taken out of its Scheduler as Migrants (request with its output
so far, the client's handle) and handed to on_requests_lost
(the pool's orphanage), which queues them on another worker's engine (adopt)
where they are prefilled over prompt + output and go on where they stopped:
the client sees no token twice and none lost. Then the engine reconnects with
backoff (a flapping worker is held out longer) and serves again from an empty
state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import structlog

from common.cancel_safe import cancel_and_wait
from common.errors import ServiceError
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.config.core import SchedulerConfig
from scheduler_svc.config.faults import FaultConfig
from scheduler_svc.core.request import Request
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.workers.adapter_loads import AdapterLoads, adapter_residency
from scheduler_svc.workers.client import WorkerClient, WorkerLost
from scheduler_svc.workers.engine_moves import EngineMoves
from scheduler_svc.workers.engine_readings import EngineReadings
from scheduler_svc.workers.handle import Migrant, RequestHandle, RequestHandles
from scheduler_svc.workers.liveness import Comeback, keep_trying
from scheduler_svc.workers.step_loop import StepLoop

if TYPE_CHECKING:
    from scheduler_svc.kv_events.replica import ReplicaKVEvents
    from scheduler_svc.metrics import SchedulerMetrics

log = structlog.get_logger("scheduler.engine")


# One reconnect attempt's wait (the channel retries within it; keep_trying spaces them).
RECONNECT_ATTEMPT_S = 2.0


class WorkerEngine(EngineReadings, EngineMoves):
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
        kv_events: ReplicaKVEvents | None = None,
    ) -> None:
        self.address = address
        # The replica's KV-event stream: each Scheduler's block manager reports to it.
        self.kv_events = kv_events
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
        self._handles = RequestHandles()
        self._loop = StepLoop(
            self.client,
            self._handles,
            self.faults,
            metrics,
            self._count_step,
            on_schedule=lambda: self.adapter_loads.kick(self.scheduler),
        )
        self._task: asyncio.Task | None = None
        # LoRA: the worker's adapter loads, beside the steps (adapter_loads.py).
        self.adapter_loads = AdapterLoads(self.client, self._loop.wakeup.set)
        # Moves with KV to and from this worker (engine_moves.py).
        self._init_moves()
        # Called after each step's result is applied, before its outputs are delivered
        # (a prefill worker's: workers/prefill_split.py moves what finished its prefill).
        self.after_step: Callable[[WorkerEngine], None] | None = None

    def _count_step(self) -> None:
        self.steps += 1
        self._step_answered()
        if self.after_step is not None:
            self.after_step(self)

    # -- requests in and out --------------------------------------------------------------

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
            self.scheduler.adopt(request)
        except ValueError as error:
            raise ServiceError(str(error), grpc.StatusCode.UNAVAILABLE) from error
        migrant.handle.holder = self
        self._handles.add(migrant.handle)
        self.adapter_loads.kick(self.scheduler)
        self._loop.wakeup.set()

    async def start(self, connect_timeout_s: float) -> None:
        """Connects (raising WorkerLost after the timeout) and starts the loop."""
        await self.client.connect(connect_timeout_s)
        self._reset_scheduler()
        self._task = asyncio.create_task(self._run(), name=f"engine {self.address}")

    def _worker_lost(self, error: WorkerLost) -> None:
        """The client found the worker lost (maybe while this engine idles): place
        nothing more here, and wake the loop to recover."""
        self._set_connected(False)
        self._loop.wakeup.set()

    def _withdraw_cache(self) -> None:
        """The worker's KV is gone (lost, reconnecting with an empty pool, or removed):
        its cached blocks leave the replica's event stream, and its block manager, still
        read while its requests are handed over, reports nothing more."""
        if self.kv_events is None or self.scheduler is None:
            return
        manager = self.scheduler.block_manager
        if manager.events is not None:
            manager.events = None
            self.kv_events.withdraw(manager.cached_block_hashes())

    def _reset_scheduler(self) -> None:
        self._withdraw_cache()
        description = self.client.description
        self.scheduler = Scheduler(
            self.config,
            num_blocks=description.num_kv_blocks,
            block_size=description.block_size,
            max_model_len=description.max_model_len,
            eos_token_ids=self.tokenizer.eos_token_ids,
            stats=self.stats,
            max_in_flight=self.config.max_steps_in_flight,
            deferred_masks=description.accepts_deferred_masks,
            drafts=description.accepts_draft_tokens,
            constrained_drafts=description.accepts_constrained_drafts,
            draft_row_cost=description.draft_row_cost,
            kv_events=self.kv_events,
            adapters=adapter_residency(self.config.lora, description),
        )
        self.scheduler.queue.mover = self.victim_mover  # rebalance (workers/rebalance.py)
        self._set_connected(True)
        self._comeback.connected()
        self._watch_for_shutdown()

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
        self._handles.add(handle)
        self.num_submitted += 1
        self.adapter_loads.kick(self.scheduler)
        self._loop.wakeup.set()
        return handle

    async def load_adapter_now(self, adapter: AdapterInfo) -> None:
        """Loads a LoRA adapter here before any request needs it (adapter_loads.py)."""
        await self.adapter_loads.load_now(self.scheduler, adapter)

    def retire_adapter(self, lora_id: int) -> None:
        """The registry unloaded it: evicted here once no request uses it."""
        self.adapter_loads.retire(self.scheduler, lora_id)

    def abort_local(self, request_id: str) -> bool:
        """Aborts the request if this engine holds it (its blocks are freed at the next
        step); whether it did."""
        if self._handles.pop(request_id) is None:
            return False
        if self.scheduler is not None:
            self.scheduler.abort_request(request_id)
            self._loop.wakeup.set()
        return True

    async def stop(self) -> None:
        """Stops the loop and closes the stream; requests still here end with UNAVAILABLE,
        as when a worker is lost (the pool stops an engine whose worker left DNS)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self.adapter_loads.stop()
        self._stop_shutdown_watch()
        await self.client.close()
        self._withdraw_cache()
        self._fail_all(f"worker {self.address} was removed from the pool")
        self._set_connected(False)

    async def _run(self) -> None:
        while True:
            try:
                await self._loop.run(self.scheduler)
            except WorkerLost as error:
                await self._recover(error)

    async def _recover(self, error: WorkerLost) -> None:
        """Hands the worker's unfinished requests to the pool, then reconnects with backoff.

        The old stream is given up first (nothing read from it counts any more);
        the reconnected worker starts from an empty state: a new stream resets it.
        """
        self._set_connected(False)
        self._withdraw_cache()
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
        self._unpark_all()
        self._handles.deliver_failures(self.scheduler.take_failed())
        now = time.monotonic()
        migrants = []
        for request in self.scheduler.take_unfinished():
            handle = self._handles.pop(request.request_id)
            if handle is None:
                continue  # its client is gone
            migrants.append(Migrant(request, handle, now))
        # Any queue left has no request behind it any more (cannot happen; never hang one).
        self._fail_all(f"worker {self.address} was lost")
        return migrants

    def _fail_all(self, reason: str) -> None:
        failure = ServiceError(f"{reason}; retry the request", grpc.StatusCode.UNAVAILABLE)
        self._handles.fail_all(failure)
