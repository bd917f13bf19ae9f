"""The core's end of the API processes: requests in, one message of outputs per step out.

Each API process connects once and says HELLO. Its SUBMITs become requests in the
pool, checked against the limits that only the core sees whole (queued requests,
open streams across every API process, duplicate ids). A submitted request's handle
gets an _Outbound as its queue, so the step loop delivers to it exactly as to a
local client, and what it delivers collects in the API process's outbox, which is
sent once the step's delivery is done (call_soon): one message per step per API
process, whatever the number of requests. Nothing here costs per character, and the
per-token part is appending a tuple.

An API process that goes away takes its clients with it: its requests are aborted
and on_edge_lost says so (the core then shuts down; see supervisor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from common.cancel_safe import cancel_and_wait, set_within
from common.errors import ServiceError
from common.metrics import exposition
from scheduler_svc.api import admission
from scheduler_svc.core.request import Request, RequestOutput
from scheduler_svc.split import messages as m
from scheduler_svc.split.channel import Channel, ChannelClosed
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.workers.handle import RequestHandle
from scheduler_svc.workers.pool import WorkerPool

log = structlog.get_logger("scheduler.core")

# How often the API processes hear the queue length between worker changes.
SNAPSHOT_INTERVAL_S = 0.25


class _Edge:
    """One API process as the core holds it."""

    def __init__(self, index: int, channel: Channel) -> None:
        self.index = index
        self.channel = channel
        self.outputs: list[tuple] = []
        self.endings: list[tuple] = []
        self._flush_scheduled = False
        self.request_ids: set[str] = set()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not (self.outputs or self.endings):
            return
        outputs, endings, self.outputs, self.endings = self.outputs, self.endings, [], []
        # A closed channel: its reader handles the loss.
        with contextlib.suppress(ChannelClosed):
            self.channel.send((m.OUTPUTS, outputs, endings))


class _Outbound:
    """A core-side request handle's queue: what it is given goes to its API process."""

    __slots__ = ("edge", "handle", "hub")

    def __init__(self, edge: _Edge, handle: RequestHandle, hub: EdgeHub) -> None:
        self.edge, self.handle, self.hub = edge, handle, hub

    def put_nowait(self, item: RequestOutput | ServiceError) -> None:
        edge = self.edge
        if isinstance(item, ServiceError):
            self.hub.forget(self.handle.request_id)
            edge.endings.append(self._ending(m.encode_error(item)))
        else:
            edge.outputs.append(m.encode_output(item))
            if item.finish_reason is not None:
                self.hub.forget(item.request_id)
                edge.endings.append(self._ending(None))
        edge.schedule_flush()

    def _ending(self, error: tuple | None) -> tuple:
        handle = self.handle
        return (handle.request_id, handle.first_scheduled, handle.address, error)


class EdgeHub:
    def __init__(
        self,
        pool: WorkerPool,
        registry,
        grammars: GrammarCompiler,
        *,
        num_edges: int,
        max_waiting_requests: int,
        max_concurrent_streams: int,
        on_edge_lost: Callable[[int], None],
    ) -> None:
        self._pool = pool
        self._registry = registry
        self._grammars = grammars
        # Constrained requests whose grammar compiles, by id (an abort cancels one).
        self._compiling: dict[str, asyncio.Task] = {}
        self._num_edges = num_edges
        self._max_waiting = max_waiting_requests
        self._max_streams = max_concurrent_streams
        self._on_edge_lost = on_edge_lost
        self._edges: dict[int, _Edge] = {}
        # Requests in flight, by id, whichever API process owns them.
        self._live: dict[str, tuple[_Edge, RequestHandle]] = {}
        # Set once every API process has said HELLO.
        self.ready = asyncio.Event()
        self._snapshots: asyncio.Task | None = None
        self._pool_calls: set[asyncio.Task] = set()

    @property
    def num_live(self) -> int:
        return len(self._live)

    def forget(self, request_id: str) -> None:
        entry = self._live.pop(request_id, None)
        if entry is not None:
            entry[0].request_ids.discard(request_id)

    async def on_channel(self, channel: Channel) -> None:
        kind, index = await channel.recv()
        if kind != m.HELLO:
            await channel.close()
            return
        edge = _Edge(index, channel)
        self._edges[index] = edge
        channel.send((m.SNAPSHOT, self.snapshot()))
        if len(self._edges) >= self._num_edges:
            self.ready.set()
        if self._snapshots is None:
            self._snapshots = asyncio.create_task(self._send_snapshots(), name="snapshots")
        try:
            while True:
                self._handle(edge, await channel.recv())
        except ChannelClosed:
            pass
        finally:
            self._edge_gone(edge)

    def _handle(self, edge: _Edge, message: tuple) -> None:
        kind = message[0]
        if kind == m.SUBMIT:
            self._submit(edge, *message[1:])
        elif kind == m.ABORT:
            compiling = self._compiling.pop(message[1], None)
            if compiling is not None:
                compiling.cancel()
            entry = self._live.pop(message[1], None)
            if entry is not None:
                entry[0].request_ids.discard(message[1])
                entry[1].abort()
        elif kind == m.METRICS:
            _, nonce, accept = message
            body, content_type = exposition(self._registry, accept)
            edge.channel.send((m.METRICS, nonce, body, content_type))
        elif kind in m.POOL_CALLS:
            task = asyncio.create_task(self._pool_call(edge, message))
            self._pool_calls.add(task)
            task.add_done_callback(self._pool_calls.discard)
        else:
            log.error("unknown message from an API process", kind=kind, api_process=edge.index)

    def _submit(self, edge: _Edge, *fields) -> None:
        constraint = fields[-1]
        if constraint is None:
            self._place_for(edge, fields[:-1], None)
            return
        # A structured output: its grammar compiles in the compiler's thread (cached; the
        # API process compiled it once already, so it is valid), then the request is
        # placed; an abort that comes meanwhile cancels it (self._compiling).
        request_id = fields[0]
        task = asyncio.create_task(self._compile_then_place(edge, fields[:-1], constraint))
        self._compiling[request_id] = task
        task.add_done_callback(lambda _: self._compiling.pop(request_id, None))

    async def _compile_then_place(self, edge: _Edge, fields: tuple, constraint) -> None:
        try:
            grammar = await self._grammars.compile(constraint)
        except ServiceError as error:
            self._refuse(edge, fields[0], error)
            return
        self._place_for(edge, fields, grammar)

    def _place_for(self, edge: _Edge, fields: tuple, grammar) -> None:
        request_id = fields[0]
        try:
            handle = self._place(*fields, grammar)
        except ServiceError as error:
            self._refuse(edge, request_id, error)
            return
        handle.queue = _Outbound(edge, handle, self)
        self._live[request_id] = (edge, handle)
        edge.request_ids.add(request_id)

    async def _pool_call(self, edge: _Edge, message: tuple) -> None:
        """A LoRA load or unload, or a drain, from an API process: done by the pool (the
        registry and the workers are the core's); after an adapter call every API process
        gets the new list before the caller's answer."""
        kind, nonce, *arguments = message
        result, error = None, None
        try:
            if kind == m.LOAD_ADAPTER:
                result = await self._pool.load_adapter(*arguments)
            elif kind == m.UNLOAD_ADAPTER:
                await self._pool.unload_adapter(*arguments)
            else:
                result = await self._pool.drain(*arguments)
        except ServiceError as refused:
            error = m.encode_error(refused)
        if kind != m.DRAIN_WORKER:
            self._broadcast_snapshot()
        with contextlib.suppress(ChannelClosed):
            edge.channel.send((m.CALL_REPLY, nonce, result, error))

    def _broadcast_snapshot(self) -> None:
        snapshot = self.snapshot()
        for edge in list(self._edges.values()):
            with contextlib.suppress(ChannelClosed):
                edge.channel.send((m.SNAPSHOT, snapshot))

    def _refuse(self, edge: _Edge, request_id: str, error: ServiceError) -> None:
        edge.endings.append((request_id, None, "", m.encode_error(error)))
        edge.schedule_flush()

    def _place(
        self, request_id, prompt_token_ids, sampling, priority, deadline, lora_name, grammar
    ) -> RequestHandle:
        """The checks GenerationService._place makes, against the whole deployment."""
        pool = self._pool
        # By name again: an adapter unloaded since the API process's copy is NOT_FOUND.
        adapter = pool.adapter(lora_name)
        admission.require_a_worker(bool(pool.connected_engines()), pool.accepts_without_worker())
        admission.require_unique_id(request_id, self._live)
        admission.require_queue_room(pool.num_waiting, self._max_waiting)
        admission.require_stream_room(len(self._live), self._max_streams)
        # A Request made here, not in the API process: its seq_id must be unique in
        # the core, which hands it to the workers.
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=sampling,
            arrival_time=time.monotonic(),
            priority=priority,
            deadline=deadline,
            structured=grammar.new_matcher() if grammar is not None else None,
            adapter=adapter,
        )
        return pool.submit(request)

    def _edge_gone(self, edge: _Edge) -> None:
        if self._edges.get(edge.index) is not edge:
            return
        del self._edges[edge.index]
        for request_id in list(edge.request_ids):
            entry = self._live.pop(request_id, None)
            if entry is not None:
                entry[1].abort()
        edge.request_ids.clear()
        self._on_edge_lost(edge.index)

    def snapshot(self) -> m.PoolSnapshot:
        pool = self._pool
        engines = tuple(
            m.EngineSnapshot(
                engine.address,
                engine.capacity_tokens,
                engine.client.description.SerializeToString(),
            )
            for engine in pool.connected_engines()
        )
        has_limits = bool(engines) or pool.accepts_without_worker()
        return m.PoolSnapshot(
            engines=engines,
            num_waiting=pool.num_waiting,
            max_model_len=pool.max_model_len if has_limits else 0,
            vocab_size=pool.vocab_size if has_limits else 0,
            max_worker_capacity_tokens=pool.max_worker_capacity_tokens if has_limits else 0,
            accepts_without_worker=pool.accepts_without_worker(),
            lora_enabled=pool.lora_enabled,
            adapters=tuple(pool.adapters()),
        )

    async def _send_snapshots(self) -> None:
        """The pool to every API process: at once on a worker change, else every 0.25 s."""
        changed = self._pool.changed
        while True:
            await set_within(changed, SNAPSHOT_INTERVAL_S)  # wait_for could lose stop()'s cancel
            changed.clear()
            self._broadcast_snapshot()

    async def stop(self) -> None:
        if self._snapshots is not None:
            await cancel_and_wait(self._snapshots)
        for edge in list(self._edges.values()):
            await edge.channel.close()
