"""A request as its Generate handler holds it, wherever the request runs.

The handler streams from the handle's queue and, when its client goes, aborts
through the handle. Whoever holds the request now (a worker's engine, or the
orphanage while it waits for a worker) is the handle's holder; moving a lost
worker's request elsewhere only changes the holder, so the handler never
learns of the move and never has to ask around for its request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from common.errors import ServiceError
from scheduler_svc.core.request import Request, RequestOutput

# What a Generate handler reads from its queue: outputs, or the error that ended it.
StreamItem = RequestOutput | ServiceError


class Holder(Protocol):
    """Where a request is now: an engine, or the orphanage."""

    address: str

    def abort_local(self, request_id: str) -> bool: ...


@dataclass(eq=False)
class RequestHandle:
    request_id: str
    holder: Holder
    queue: asyncio.Queue[StreamItem] = field(default_factory=asyncio.Queue)
    # When a plan first included the request (time.monotonic()); its queue time ends there.
    first_scheduled: float | None = None
    # The workers it left with its KV (workers/kv_moves.py), oldest first: in its trace.
    moved_from: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.holder.address

    def abort(self) -> None:
        """The client is gone: its holder frees the request's blocks at the next step."""
        self.holder.abort_local(self.request_id)

    def fail(self, error: ServiceError) -> None:
        self.queue.put_nowait(error)


@dataclass
class Migrant:
    """An unfinished request off a lost worker (or a new one with no worker yet),
    on its way to a worker: its output so far lives in request."""

    request: Request
    handle: RequestHandle
    # Since when it waits for a worker (time.monotonic()).
    lost_at: float


class RequestHandles:
    """The handles of the requests one engine holds, by request id: where the step
    loop delivers outputs and errors, and what placement counts as load."""

    def __init__(self) -> None:
        self._by_id: dict[str, RequestHandle] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def add(self, handle: RequestHandle) -> None:
        self._by_id[handle.request_id] = handle

    def pop(self, request_id: str) -> RequestHandle | None:
        return self._by_id.pop(request_id, None)

    def get(self, request_id: str) -> RequestHandle | None:
        return self._by_id.get(request_id)

    def deliver(self, output: RequestOutput) -> None:
        """Hands a step's output to its client's stream (dropped if its client left)."""
        handle = self._by_id.get(output.request_id)
        if handle is None:
            return  # aborted while its step was in flight
        handle.queue.put_nowait(output)
        if output.finish_reason is not None:
            del self._by_id[output.request_id]

    def deliver_failures(self, failed: list[Request]) -> None:
        """Ends the streams of requests the scheduler failed (deadline, pool too small)."""
        for request in failed:
            handle = self._by_id.pop(request.request_id, None)
            if handle is not None:
                handle.fail(ServiceError(request.error.message, request.error.code))

    def fail_all(self, error: ServiceError) -> None:
        for handle in self._by_id.values():
            handle.fail(error)
        self._by_id.clear()
