"""The scheduler's workers, which come and go, and which one a new request goes to.

Two kinds of worker, one engine each: static ones (--worker), which must all
answer at start and are reconnected forever when lost, and discovered ones
(--worker-dns, see worker_discovery), added and removed while the scheduler
runs. A discovered worker is connected in the background, retrying until it
answers or its address disappears, so the scheduler starts before any worker
is up and becomes SERVING when the first one connects (`changed` is set on
every connect and disconnect; the health status follows it).

Requests of a lost worker (engine.Migrations) are queued on the connected
worker with the fewest requests in flight whose pool holds them. With no such
worker they wait in the pool for one to connect (a lost worker reconnecting
counts), and so do new requests that arrive while no worker is connected
(park): until their own deadline (then DEADLINE_EXCEEDED), or, without one,
for --worker-wait-timeout (then UNAVAILABLE); --max-waiting-requests counts
them. Only before any worker has ever described itself is a new request
refused at once: its model limits are not known yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc
import structlog

from common.errors import ServiceError
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.validation import ValidatedRequest
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.output.output_processor import RequestOutputProcessor
from scheduler_svc.workers.client import WorkerLost
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.migration import Migrant, new_request

if TYPE_CHECKING:
    from scheduler_svc.metrics import SchedulerMetrics

log = structlog.get_logger("scheduler.pool")


class WorkerPool:
    def __init__(
        self,
        config: SchedulerConfig,
        tokenizer: Tokenizer,
        metrics: SchedulerMetrics | None = None,
        connect_timeout_s: float = 30.0,
        faults: FaultConfig | None = None,
    ) -> None:
        self.config = config
        self.faults = faults if faults is not None else FaultConfig()
        self.tokenizer = tokenizer
        self.metrics = metrics
        # How long one background connection attempt of a discovered worker lasts
        # before it is logged and retried.
        self.connect_timeout_s = connect_timeout_s
        self.engines: dict[str, WorkerEngine] = {}
        # Set whenever a worker connects or disconnects.
        self.changed = asyncio.Event()
        # Counters of removed engines, so that the totals exported never go down.
        self.retired_stats = SchedulerStats()
        self._static: set[str] = set()
        self._connecting: dict[str, asyncio.Task] = {}
        # Requests of lost workers waiting for a worker to take them, by request id.
        self._orphans: dict[str, Migrant] = {}
        self._orphan_timer: asyncio.TimerHandle | None = None
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
            migrations=self,
        )
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
        if engine.connected and self._orphans:
            self._place_orphans()

    # -- new requests while no worker is connected -----------------------------------

    # What the Generate handler reads as a parked request's "engine" address.
    address = "(waiting for a worker)"

    def accepts_without_worker(self) -> bool:
        """Whether a new request may wait for a worker: one has connected before, so
        its model limits are known."""
        return bool(self._known_descriptions)

    def park(self, validated: ValidatedRequest, deadline: float | None) -> asyncio.Queue:
        """Queues a new request until a worker connects; it waits as the requests of
        a lost worker do (until its deadline, or --worker-wait-timeout without one)."""
        request = new_request(validated, deadline)
        eos = self.tokenizer.eos_token_ids
        processor = RequestOutputProcessor(request, self.tokenizer, eos, self.max_model_len)
        queue: asyncio.Queue = asyncio.Queue()
        migrant = Migrant(request, processor, queue, first_scheduled=None, lost_at=time.monotonic())
        self._orphans[request.request_id] = migrant
        self._place_orphans()
        return queue

    def abort(self, request_id: str) -> None:
        """A parked request's client is gone (the handler calls this as on an engine)."""
        self.abort_moved(request_id)

    def take_first_scheduled_time(self, request_id: str) -> float | None:
        return self.take_moved_first_scheduled_time(request_id)

    # -- requests of lost workers (engine.Migrations) ---------------------------------

    def requests_lost(self, engine: WorkerEngine, migrants: list[Migrant]) -> None:
        """Resumes a lost worker's requests elsewhere, or keeps them until a worker connects."""
        for migrant in migrants:
            self._orphans[migrant.request.request_id] = migrant
        log.warning(
            "moving a lost worker's requests",
            worker=engine.address,
            requests=len(migrants),
            workers_connected=len(self.connected_engines()),
        )
        self._place_orphans()

    def _place_orphans(self) -> None:
        for request_id, migrant in list(self._orphans.items()):
            request = migrant.request
            num_tokens = request.num_prompt_tokens + request.sampling.max_tokens
            fitting = [e for e in self.connected_engines() if e.fits(num_tokens)]
            if not fitting:
                continue
            engine = min(fitting, key=lambda e: (e.load, e.num_submitted))
            del self._orphans[request_id]
            try:
                engine.adopt(migrant)
            except ServiceError as error:
                migrant.queue.put_nowait(error)
                continue
            log.info(
                "request resumed on another worker",
                request_id=request_id,
                worker=engine.address,
                output_tokens=request.num_output_tokens,
            )
        self._arm_orphan_timer()

    def _arm_orphan_timer(self) -> None:
        if self._orphan_timer is not None:
            self._orphan_timer.cancel()
            self._orphan_timer = None
        if not self._orphans:
            return
        first = min(self._gives_up_at(migrant) for migrant in self._orphans.values())
        delay = max(0.0, first - time.monotonic())
        self._orphan_timer = asyncio.get_running_loop().call_later(delay, self._expire_orphans)

    def _gives_up_at(self, migrant: Migrant) -> float:
        """When a request waiting for a worker stops waiting (time.monotonic())."""
        deadline = migrant.request.deadline
        if deadline is not None:
            return deadline
        return migrant.lost_at + self.faults.worker_wait_timeout_s

    def _expire_orphans(self) -> None:
        self._orphan_timer = None
        now = time.monotonic()
        timeout = self.faults.worker_wait_timeout_s
        for request_id, migrant in list(self._orphans.items()):
            if self._gives_up_at(migrant) > now:
                continue
            del self._orphans[request_id]
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
            migrant.queue.put_nowait(error)
        self._arm_orphan_timer()

    def abort_moved(self, request_id: str) -> None:
        if self._orphans.pop(request_id, None) is not None:
            self._arm_orphan_timer()
            return
        for engine in self.engines.values():
            if engine.abort_local(request_id):
                return

    def take_moved_first_scheduled_time(self, request_id: str) -> float | None:
        migrant = self._orphans.get(request_id)
        if migrant is not None:
            return migrant.first_scheduled
        for engine in self.engines.values():
            first = engine.take_local_first_scheduled_time(request_id)
            if first is not None:
                return first
        return None

    async def start(self, addresses: Sequence[str], connect_timeout_s: float) -> None:
        """Connects the static workers; raises WorkerLost naming the first that did not answer."""
        engines = [self._new_engine(address) for address in dict.fromkeys(addresses)]
        self._static.update(addresses)
        await asyncio.gather(*(engine.start(connect_timeout_s) for engine in engines))
        models = {engine.client.description.model_name for engine in engines}
        if len(models) > 1:
            raise ValueError(f"workers serve different models: {sorted(models)}")

    def add(self, address: str) -> None:
        """A discovered worker: connects in the background until it answers or is removed."""
        if address in self.engines:
            return
        engine = self._new_engine(address)
        self._connecting[address] = asyncio.create_task(
            self._connect(engine), name=f"connect {address}"
        )

    async def _connect(self, engine: WorkerEngine) -> None:
        attempts = 0
        while True:
            attempts += 1
            try:
                await engine.start(self.connect_timeout_s)
                break
            except WorkerLost as error:
                log.warning("worker not answering yet", worker=engine.address, error=str(error))
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

    async def remove(self, address: str) -> None:
        """Drops a discovered worker; its in-flight requests end with UNAVAILABLE."""
        if address in self._static or address not in self.engines:
            return
        connecting = self._connecting.pop(address, None)
        if connecting is not None:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
        engine = self.engines.pop(address)
        await engine.stop()
        self._retire(engine.stats)
        if self.metrics is not None:
            self.metrics.forget_worker(address)

    def _retire(self, stats: SchedulerStats) -> None:
        for item in dataclasses.fields(SchedulerStats):
            total = getattr(self.retired_stats, item.name) + getattr(stats, item.name)
            setattr(self.retired_stats, item.name, total)

    async def stop(self) -> None:
        if self._orphan_timer is not None:
            self._orphan_timer.cancel()
            self._orphan_timer = None
        for migrant in self._orphans.values():
            migrant.queue.put_nowait(
                ServiceError(
                    "the scheduler is stopping; retry the request", grpc.StatusCode.UNAVAILABLE
                )
            )
        self._orphans.clear()
        for task in self._connecting.values():
            task.cancel()
        await asyncio.gather(*self._connecting.values(), return_exceptions=True)
        self._connecting.clear()
        await asyncio.gather(*(engine.stop() for engine in self.engines.values()))

    @property
    def num_waiting(self) -> int:
        """Requests queued on every worker, not yet running, and those waiting for a worker."""
        return len(self._orphans) + sum(engine.num_waiting for engine in self.engines.values())

    def connected_engines(self) -> list[WorkerEngine]:
        return [engine for engine in self.engines.values() if engine.connected]

    def pick(self, prompt_token_ids: Sequence[int], num_tokens: int) -> WorkerEngine:
        """Of the connected workers whose pool can hold num_tokens: the longest cached
        prefix of the prompt, then the fewest requests in flight, then the fewest
        placed so far (equal workers take turns).

        A cached prefix counts only on a worker with nobody waiting: a hit saves a
        prefill, but queueing behind a backlog costs more, and without this rule
        every request sharing a popular prefix (a system prompt) would pile onto
        the one worker that cached it while the others idle.
        """
        engines = self.connected_engines()
        if not engines:
            raise ServiceError(
                "no worker is connected; try again shortly", grpc.StatusCode.UNAVAILABLE
            )
        fitting = [engine for engine in engines if engine.fits(num_tokens)]
        if not fitting:
            raise ServiceError(
                f"no connected worker's KV pool holds {num_tokens} tokens; lower max_tokens",
                grpc.StatusCode.UNAVAILABLE,
            )
        return max(
            fitting,
            key=lambda engine: (
                engine.cached_prefix_tokens(prompt_token_ids) if engine.num_waiting == 0 else 0,
                -engine.load,
                -engine.num_submitted,
            ),
        )

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
