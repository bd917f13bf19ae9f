"""What the request path (GenerationService, the HTTP front, the serving status) needs
of the pool of workers behind it, and of a placed request.

Two implementations of each: in one process, the WorkerPool and its RequestHandle
(scheduler_svc/workers/); in an API process, the RemotePool and its RemoteHandle
(scheduler_svc/split/remote_pool.py), which forward to the core. Written down as
Protocols so that the request path is typed against what both offer, and a member
added to one and used by the request path shows up as missing from the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from common.errors import ServiceError
from scheduler_svc.core.request import Request
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.workers.handle import StreamItem


class PlacedRequest(Protocol):
    """A request its Generate handler streams from (queue) and can abort."""

    request_id: str
    queue: asyncio.Queue[StreamItem]
    # When a plan first included the request (time.monotonic()); None until then.
    first_scheduled: float | None

    @property
    def address(self) -> str:
        """The worker that runs (or ran) it, for the request's log line."""
        ...

    def abort(self) -> None: ...

    def fail(self, error: ServiceError) -> None: ...


class ConnectedWorker(Protocol):
    address: str
    capacity_tokens: int


class PoolView(Protocol):
    """The workers as the request path sees them: limits to validate against, whether
    a request can be taken now, and where to submit it."""

    # Set at every connect and disconnect (serving_status follows it).
    changed: asyncio.Event

    def connected_engines(self) -> Sequence[ConnectedWorker]: ...

    def accepts_without_worker(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_worker_capacity_tokens(self) -> int: ...

    def submit(self, request: Request) -> PlacedRequest: ...

    # -- LoRA adapters (the registry is the core's; an API process keeps a copy) ----------

    @property
    def lora_enabled(self) -> bool:
        """Whether the scheduler runs with --enable-lora."""
        ...

    def adapters(self) -> list[AdapterInfo]:
        """The adapters a request may name, sorted by name ([] with LoRA off)."""
        ...

    def adapter(self, name: str) -> AdapterInfo | None:
        """The adapter a request's lora_name names; None for "" (the base model).
        ServiceError: NOT_FOUND for a name not loaded, INVALID_ARGUMENT with LoRA off."""
        ...

    async def load_adapter(
        self, name: str, path: str, base_model_name: str | None = None
    ) -> AdapterInfo:
        """Loads a PEFT LoRA directory under `name` (checked by the registry, then by a
        worker where one is connected). ServiceError: NOT_FOUND (no such directory),
        INVALID_ARGUMENT (a name already loaded, a rank over --max-lora-rank, not LoRA,
        a target module the model lacks, LoRA off)."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Unloads it: new requests naming it are NOT_FOUND at once, and it leaves each
        worker once no request there uses it. ServiceError NOT_FOUND if not loaded."""
        ...
