"""The scheduler's workers, which come and go: who is in the pool, and where a
request goes (placement) or waits (the orphanage).

Two kinds of worker, one engine each: static ones (--worker), connected in the
background from the start on (the scheduler serves once one answers, see start) and
reconnected forever when lost, and discovered ones (--worker-dns, see discovery), added
and removed while the scheduler runs. A discovered worker is connected in the
background, retrying until it answers or its address disappears, so the scheduler
starts before any worker is up and becomes SERVING when the first one connects
(`changed` is set on every connect and disconnect; the health status follows it).

Requests of a lost worker go to the orphanage, which queues them on a
connected worker that can hold them, or keeps them until one connects (a lost
worker reconnecting counts); so do new requests that arrive while no worker is
connected (park). Only before any worker has ever described itself is a new
request refused at once: its model limits are not known yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc
import structlog

from common.cancel_safe import cancel_and_wait
from common.errors import ServiceError
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.config.core import SchedulerConfig
from scheduler_svc.config.faults import FaultConfig
from scheduler_svc.core.request import Request
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.workers.drain import DrainCounts, drain_engine, drain_in_background
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import Migrant, RequestHandle
from scheduler_svc.workers.kv_moves import KvMoves
from scheduler_svc.workers.liveness import keep_trying
from scheduler_svc.workers.orphans import Orphanage
from scheduler_svc.workers.placement import pick_for_new
from scheduler_svc.workers.pool_adapters import PoolAdapters, open_registry
from scheduler_svc.workers.prefill_split import PrefillSplit
from scheduler_svc.workers.rebalance import mover_for
from scheduler_svc.workers.startup_watch import NoWorkerReady, StartupWatch

if TYPE_CHECKING:
    from common.tls import ChannelSecurity
    from scheduler_svc.kv_events.replica import ReplicaKVEvents
    from scheduler_svc.metrics import SchedulerMetrics

log = structlog.get_logger("scheduler.pool")

# One connect attempt of a static worker at start: short, so that a worker that is not
# up yet is known to be waited for (and logged) soon, while one that is up is not held.
STATIC_ATTEMPT_S = 2.0

__all__ = ["NoWorkerReady", "WorkerPool"]


class WorkerPool(PoolAdapters):
    def __init__(
        self,
        config: SchedulerConfig,
        tokenizer: Tokenizer,
        metrics: SchedulerMetrics | None = None,
        connect_timeout_s: float = 30.0,
        faults: FaultConfig | None = None,
        worker_security: ChannelSecurity | None = None,
        kv_events: ReplicaKVEvents | None = None,
    ) -> None:
        self.config = config
        # The replica's KV-event stream, which every engine's block manager reports to.
        self.kv_events = kv_events
        # TLS to every worker, static or discovered (--worker-tls-*); None: plaintext.
        self.worker_security = worker_security
        self.faults = faults if faults is not None else FaultConfig()
        self.tokenizer = tokenizer
        # LoRA adapters a request may name (pool_adapters.py); None with LoRA off.
        self.registry = open_registry(config.lora, getattr(tokenizer, "name", ""))
        self.metrics = metrics
        # How long one background connection attempt of a discovered worker lasts
        # before it is logged and retried.
        self.connect_timeout_s = connect_timeout_s
        self.engines: dict[str, WorkerEngine] = {}
        # Set whenever a worker connects or disconnects.
        self.changed = asyncio.Event()
        # Counters of removed engines, so that the totals exported never go down.
        self.retired_stats = SchedulerStats()
        self.split = PrefillSplit(self.placeable_engines, lambda: self.kv_moves)  # --prefill-worker
        self.orphans = Orphanage(self.faults.worker_wait_timeout_s, self.split.decode_engines)
        # Requests moved with their KV (drain, removal): kv_moves.py, drain.py.
        self.kv_moves = KvMoves(self.orphans, getattr(metrics, "kv_transfers", None))
        self._static: set[str] = set()
        self._connecting: dict[str, asyncio.Task] = {}
        # The last description of every worker ever connected: the model limits
        # new requests are validated against while no worker is connected.
        self._known_descriptions: dict[str, object] = {}

    def _new_engine(self, address: str) -> WorkerEngine:
        engine = WorkerEngine(
            address,
            self.config,
            self.tokenizer,
            metrics=self.metrics,
            on_connection_change=self._connection_changed,
            faults=self.faults,
            kv_events=self.kv_events,
        )
        # Kept by the client, which opens every connect and reconnect with it.
        engine.client.security = self.worker_security
        engine.on_requests_lost = lambda migrants: self._requests_lost(engine, migrants)
        engine.on_shutting_down = lambda: drain_in_background(engine, self)
        engine.after_step = self.split.after_step
        engine.victim_mover = mover_for(engine, self)  # move instead of preempting
        self.engines[address] = engine
        return engine

    def _connection_changed(self, engine: WorkerEngine) -> None:
        log.info(
            "worker connected" if engine.connected else "worker disconnected",
            worker=engine.address,
            workers_connected=len(self.connected_engines()),
        )
        self.changed.set()
        if engine.connected:
            self._known_descriptions[engine.address] = engine.client.description
            self.orphans.place()

    def _requests_lost(self, engine: WorkerEngine, migrants: list[Migrant]) -> None:
        log.warning(
            "moving a lost worker's requests",
            worker=engine.address,
            requests=len(migrants),
            workers_connected=len(self.connected_engines()),
        )
        self.orphans.take_in(migrants)

    # -- placing new requests -----------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Queues a new request on the best connected worker (placement), or, with none
        connected, in the orphanage until one connects; raises ServiceError."""
        engines = self.placeable_engines()
        if not engines and self.accepts_without_worker():
            return self.park(request)
        return self.split.pick(engines, request).submit(request)

    def accepts_without_worker(self) -> bool:
        """Whether a new request may wait for a worker: one has connected before, so
        its model limits are known."""
        return bool(self._known_descriptions)

    def park(self, request: Request) -> RequestHandle:
        """Queues a new request until a worker connects (as a lost worker's requests wait)."""
        handle = RequestHandle(request.request_id, self.orphans)
        self.orphans.take_in([Migrant(request, handle, lost_at=time.monotonic())])
        return handle

    def pick(self, prompt_token_ids: Sequence[int], num_tokens: int) -> WorkerEngine:
        """The connected worker a new request would go to (see placement.pick_for_new)."""
        return pick_for_new(self.placeable_engines(), prompt_token_ids, num_tokens)

    # -- membership -----------------------------------------------------------------------

    async def start(self, addresses: Sequence[str], connect_timeout_s: float) -> None:
        """Connects the static workers (--worker) in the background, each retried with the
        reconnect backoff, whatever order the processes started in; returns once one of them
        serves and every other one has connected or failed an attempt, so that workers that
        are up are all in the pool from the first request on. Raises NoWorkerReady when
        none serves within connect_timeout_s. A worker still loading then is retried for as
        long as the scheduler runs, as a lost static worker is."""
        addresses = list(dict.fromkeys(addresses))
        if not addresses:
            return  # --worker-dns only: serving follows discovery
        self._static.update(addresses)
        watch = StartupWatch(addresses)
        log.info("waiting for workers", workers=addresses, timeout_s=connect_timeout_s)
        for address in addresses:
            engine = self._new_engine(address)
            attempt_s = min(connect_timeout_s / 2, STATIC_ATTEMPT_S)
            self._connecting[address] = asyncio.create_task(
                self._connect(engine, attempt_s, watch), name=f"connect {address}"
            )
        try:
            await asyncio.wait_for(watch.settled.wait(), connect_timeout_s)
        except asyncio.TimeoutError:
            raise NoWorkerReady(watch.why_none_ready(connect_timeout_s)) from None
        if watch.waiting:
            log.warning(
                "serving before every worker is ready; the others are retried",
                workers_connected=len(self.connected_engines()),
                waiting_for=watch.waiting,
            )

    def add(self, address: str) -> None:
        """A discovered worker: connects in the background until it answers or is removed."""
        if address in self.engines:
            return
        engine = self._new_engine(address)
        self._connecting[address] = asyncio.create_task(
            self._connect(engine, self.connect_timeout_s), name=f"connect {address}"
        )

    async def _connect(
        self, engine: WorkerEngine, attempt_s: float, watch: StartupWatch | None = None
    ) -> None:
        def not_yet(error: Exception) -> None:
            log.warning("worker not ready yet", worker=engine.address, reason=str(error))
            if watch is not None:
                watch.failed(engine.address, str(error))

        await keep_trying(lambda: engine.start(attempt_s), not_yet)
        self._connecting.pop(engine.address, None)
        others = {
            other.client.description.model_name
            for other in self.connected_engines()
            if other is not engine
        }
        model = engine.client.description.model_name
        if others and model not in others:
            # Refused but kept, so the next lookup does not add it again.
            log.error("worker serves another model; not used", worker=engine.address, model=model)
            await engine.stop()
            if watch is not None:
                watch.failed(engine.address, f"serves {model}, not {sorted(others)}")
            return
        if self.registry is not None and engine.client.description.max_cpu_loras == 0:
            reason = "has no LoRA adapter slots (start it with --enable-lora)"
            log.error(f"worker {reason}; not used", worker=engine.address)
            await engine.stop()
            if watch is not None:
                watch.failed(engine.address, reason)
            return
        if watch is not None:
            watch.connected(engine.address)

    async def drain(self, address: str) -> DrainCounts:
        """Moves every request off the worker (drain.py), then drops a discovered one (a
        static one stays out); ServiceError NOT_FOUND, or FAILED_PRECONDITION (the only)."""
        engine = self.engines.get(address)
        if engine is None:
            raise ServiceError(f"no worker {address!r} in the pool", grpc.StatusCode.NOT_FOUND)
        if not [other for other in self.placeable_engines() if other is not engine]:
            raise ServiceError(
                f"worker {address} is the only one serving: nowhere to move its requests",
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        counts = await drain_engine(engine, self.split.decode_engines, self.kv_moves)
        if address not in self._static:
            await self._drop(address)
        return counts

    async def remove(self, address: str) -> None:
        """Drops a discovered worker, drained first (with no other: UNAVAILABLE)."""
        if address in self._static or address not in self.engines:
            return
        engine = self.engines[address]
        if engine.connected and not engine.draining and len(self.placeable_engines()) > 1:
            await drain_engine(engine, self.split.decode_engines, self.kv_moves)
        if address in self.engines:
            await self._drop(address)

    async def _drop(self, address: str) -> None:
        connecting = self._connecting.pop(address, None)
        if connecting is not None:
            await cancel_and_wait(connecting)
        engine = self.engines.pop(address)
        await engine.stop()
        self._retire(engine.stats)
        if self.metrics is not None:
            self.metrics.forget_worker(address)

    def _retire(self, stats: SchedulerStats) -> None:
        self.retired_stats.add(stats)

    async def stop(self) -> None:
        self.orphans.fail_all(
            ServiceError(
                "the scheduler is stopping; retry the request", grpc.StatusCode.UNAVAILABLE
            )
        )
        for task in self._connecting.values():
            task.cancel()
        await asyncio.gather(*self._connecting.values(), return_exceptions=True)
        self._connecting.clear()
        await asyncio.gather(*(engine.stop() for engine in self.engines.values()))

    def connected_engines(self) -> list[WorkerEngine]:
        return [engine for engine in self.engines.values() if engine.connected]

    def placeable_engines(self) -> list[WorkerEngine]:
        """Connected workers a request may be placed on: not drained or draining."""
        return [
            engine for engine in self.engines.values() if engine.connected and not engine.draining
        ]

    # -- what the pool as a whole reports ---------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests queued on every worker, not yet running, and those waiting for a worker."""
        return len(self.orphans) + sum(engine.num_waiting for engine in self.engines.values())

    def _descriptions(self):
        connected = [engine.client.description for engine in self.connected_engines()]
        return connected or list(self._known_descriptions.values())

    @property
    def max_model_len(self) -> int:
        return min(description.max_model_len for description in self._descriptions())

    @property
    def vocab_size(self) -> int:
        return min(description.vocab_size for description in self._descriptions())

    @property
    def max_worker_capacity_tokens(self) -> int:
        return max(d.num_kv_blocks * d.block_size for d in self._descriptions())
