"""The pool as an API process sees it: the core's, through the channel.

GenerationService and the HTTP front use it as they use WorkerPool in a single
process: the model limits, the connected workers (for health, GetModelInfo and
/v1/models) and `submit`, which returns a handle whose queue the Generate handler
reads. Limits and workers come from the core's snapshots; a submit is sent without
waiting, and the core's verdict (an error, or the outputs) arrives on the handle's
queue like any later output, so a request costs no round trip before its first step.

The core's per-step message is fanned out here: one put per request per step, and
one wake-up of its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2
from common.errors import ServiceError
from scheduler_svc.core.request import Request
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.split import messages as m
from scheduler_svc.split.channel import Channel, ChannelClosed
from scheduler_svc.workers.drain import DrainCounts
from scheduler_svc.workers.handle import StreamItem

log = structlog.get_logger("scheduler.api_process")

# A load reads the adapter's files, here and on a worker: a few seconds at most.
ADAPTER_CALL_TIMEOUT_S = 120.0
# A drain moves every running request of a worker with its KV: seconds, a minute for a
# full pool over a slow network. Past this the caller hears DEADLINE_EXCEEDED; the core
# goes on with the drain.
DRAIN_CALL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class _Described:
    description: worker_pb2.WorkerDescription


@dataclass(frozen=True)
class RemoteEngine:
    """A connected worker as the core described it (what WorkerEngine offers readers)."""

    address: str
    capacity_tokens: int
    client: _Described


@dataclass(eq=False)
class RemoteHandle:
    request_id: str
    pool: RemotePool
    queue: asyncio.Queue[StreamItem] = field(default_factory=asyncio.Queue)
    first_scheduled: float | None = None
    # The worker that finished it, once the core says (the log line's `worker`).
    address: str = ""

    def abort(self) -> None:
        """The client left (or a stop string ended it): the core drops the request."""
        self.pool.abort(self.request_id)

    def fail(self, error: ServiceError) -> None:
        self.queue.put_nowait(error)


class RemotePool:
    def __init__(self, channel: Channel, lora_enabled: bool | None = None) -> None:
        self._channel = channel
        # From this process's own flags (the core's are the same): known before the first
        # snapshot, when the HTTP front declares its routes. None: the snapshot's.
        self._lora_enabled = lora_enabled
        self._snapshot: m.PoolSnapshot | None = None
        self._engines: list[RemoteEngine] = []
        self._handles: dict[str, RemoteHandle] = {}
        self._metrics_replies: dict[int, asyncio.Future] = {}
        self._call_replies: dict[int, asyncio.Future] = {}
        self._adapters: dict[str, AdapterInfo] = {}
        self._nonces = itertools.count()
        # Set when the set of connected workers changes (the health status follows it).
        self.changed = asyncio.Event()
        self.first_snapshot = asyncio.Event()

    # -- what GenerationService and the HTTP front read -------------------------------------

    def connected_engines(self) -> list[RemoteEngine]:
        return self._engines

    def accepts_without_worker(self) -> bool:
        return self._snapshot is not None and self._snapshot.accepts_without_worker

    @property
    def num_waiting(self) -> int:
        return self._snapshot.num_waiting if self._snapshot else 0

    @property
    def max_model_len(self) -> int:
        return self._snapshot.max_model_len

    @property
    def vocab_size(self) -> int:
        return self._snapshot.vocab_size

    @property
    def max_worker_capacity_tokens(self) -> int:
        return self._snapshot.max_worker_capacity_tokens

    def hello(self, index: int) -> None:
        """Tells the core this API process serves (the core's ready line waits for all)."""
        self._send((m.HELLO, index))

    def submit(self, request: Request) -> RemoteHandle:
        handle = RemoteHandle(request.request_id, self)
        self._handles[request.request_id] = handle
        self._send(
            (
                m.SUBMIT,
                request.request_id,
                request.prompt_token_ids,
                request.sampling,
                request.priority,
                request.deadline,
                # The constraint, not the matcher: llguidance objects do not cross
                # processes; the core compiles it again (cached there too).
                request.adapter.name if request.adapter is not None else "",
                request.structured.constraint if request.structured is not None else None,
            )
        )
        return handle

    def abort(self, request_id: str) -> None:
        if self._handles.pop(request_id, None) is not None:
            self._send((m.ABORT, request_id))

    # -- LoRA adapters: the core's registry, a copy here from its snapshots -------------

    @property
    def lora_enabled(self) -> bool:
        if self._lora_enabled is not None:
            return self._lora_enabled
        return self._snapshot is not None and self._snapshot.lora_enabled

    def adapters(self) -> list[AdapterInfo]:
        return list(self._adapters.values())

    def adapter(self, name: str) -> AdapterInfo | None:
        if not name:
            return None
        if not self.lora_enabled:
            raise ServiceError(
                f"lora_name {name!r}: this scheduler serves no LoRA adapters "
                "(start it with --enable-lora)",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        info = self._adapters.get(name)
        if info is None:
            known = ", ".join(self._adapters) or "none"
            raise ServiceError(
                f"LoRA adapter {name!r} is not loaded (loaded: {known})", grpc.StatusCode.NOT_FOUND
            )
        return info

    async def load_adapter(
        self, name: str, path: str, base_model_name: str | None = None
    ) -> AdapterInfo:
        return await self._call(m.LOAD_ADAPTER, ADAPTER_CALL_TIMEOUT_S, name, path, base_model_name)

    async def unload_adapter(self, name: str) -> None:
        await self._call(m.UNLOAD_ADAPTER, ADAPTER_CALL_TIMEOUT_S, name)

    async def drain(self, address: str) -> DrainCounts:
        """AdminService.DrainWorker through the core, whose pool moves the requests."""
        return await self._call(m.DRAIN_WORKER, DRAIN_CALL_TIMEOUT_S, address)

    async def _call(self, kind: str, timeout_s: float, *arguments):
        """Forwarded to the core's pool; after an adapter call, its snapshot with the new
        list arrives before the answer."""
        nonce = next(self._nonces)
        reply = self._call_replies[nonce] = asyncio.get_running_loop().create_future()
        self._send((kind, nonce, *arguments))
        try:
            result, error = await asyncio.wait_for(reply, timeout_s)
        except ChannelClosed:
            unavailable = grpc.StatusCode.UNAVAILABLE
            raise ServiceError("the scheduler's core process is gone", unavailable) from None
        except TimeoutError:
            raise ServiceError(
                f"the scheduler's core did not answer {kind} within {timeout_s:.0f} s",
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ) from None
        finally:
            self._call_replies.pop(nonce, None)
        if error is not None:
            raise m.decode_error(error)
        return result

    async def metrics(self, accept: str) -> tuple[bytes, str]:
        """The core's whole registry (its own series and every API process's)."""
        nonce = next(self._nonces)
        reply = self._metrics_replies[nonce] = asyncio.get_running_loop().create_future()
        self._send((m.METRICS, nonce, accept))
        try:
            return await asyncio.wait_for(reply, 10.0)
        finally:
            self._metrics_replies.pop(nonce, None)

    # -- the core's side of the conversation ------------------------------------------------

    async def run(self) -> None:
        """Reads the core's messages until the channel closes (then raises ChannelClosed)."""
        try:
            while True:
                message = await self._channel.recv()
                kind = message[0]
                if kind == m.OUTPUTS:
                    self._deliver(message[1], message[2])
                elif kind == m.SNAPSHOT:
                    self._take_snapshot(message[1])
                elif kind == m.METRICS:
                    _, nonce, body, content_type = message
                    reply = self._metrics_replies.get(nonce)
                    if reply is not None and not reply.done():
                        reply.set_result((body, content_type))
                elif kind == m.CALL_REPLY:
                    _, nonce, result, error = message
                    reply = self._call_replies.get(nonce)
                    if reply is not None and not reply.done():
                        reply.set_result((result, error))
        finally:
            self._fail_all()

    def _deliver(self, outputs: list[tuple], endings: list[tuple]) -> None:
        handles = self._handles
        for fields in outputs:
            handle = handles.get(fields[0])
            if handle is not None:
                handle.queue.put_nowait(m.decode_output(fields))
        for request_id, first_scheduled, address, error in endings:
            handle = handles.pop(request_id, None)
            if handle is None:
                continue
            handle.first_scheduled = first_scheduled
            handle.address = address
            if error is not None:
                handle.queue.put_nowait(m.decode_error(error))

    def _take_snapshot(self, snapshot: m.PoolSnapshot) -> None:
        before = {engine.address for engine in self._engines}
        self._snapshot = snapshot
        self._adapters = {info.name: info for info in snapshot.adapters}
        self._engines = [
            RemoteEngine(
                engine.address,
                engine.capacity_tokens,
                _Described(worker_pb2.WorkerDescription.FromString(engine.description)),
            )
            for engine in snapshot.engines
        ]
        if {engine.address for engine in self._engines} != before or (
            not self.first_snapshot.is_set()
        ):
            self.changed.set()
        self.first_snapshot.set()

    def _send(self, message: tuple) -> None:
        # A closed channel: run() sees the loss and fails every stream.
        with contextlib.suppress(ChannelClosed):
            self._channel.send(message)

    def _fail_all(self) -> None:
        error = ServiceError(
            "the scheduler's core process is gone; retry the request",
            grpc.StatusCode.UNAVAILABLE,
        )
        for handle in self._handles.values():
            handle.fail(error)
        self._handles.clear()
        for reply in (*self._metrics_replies.values(), *self._call_replies.values()):
            if not reply.done():
                reply.set_exception(ChannelClosed("the core is gone"))
