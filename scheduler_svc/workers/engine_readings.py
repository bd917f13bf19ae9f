"""What placement and the metrics read of one worker's engine.

placement.py picks a worker by these readings (placement.Candidate), and the pool's
metrics (pool_metrics.py) report them. They are plain reads of the engine's connection, its
Scheduler and the requests it holds; each is 0 (or nothing) before the worker has
described itself, and the prefix lookup is 0 while it is disconnected, so that a
worker being recovered attracts nothing. WorkerEngine (engine.py) inherits them: its
readers keep asking the engine, and engine.py keeps to what the engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler_svc.core.prefix_hash import extend_block_hashes

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler
    from scheduler_svc.workers.client import WorkerClient
    from scheduler_svc.workers.handle import RequestHandles


class EngineReadings:
    """Mixed into WorkerEngine, which sets these attributes."""

    client: WorkerClient
    scheduler: Scheduler | None
    _handles: RequestHandles
    _connected: bool

    @property
    def connected(self) -> bool:
        return self._connected

    def holds(self, request_id: str) -> bool:
        return request_id in self._handles

    @property
    def load(self) -> int:
        return len(self._handles)

    @property
    def capacity_tokens(self) -> int:
        """Tokens of KV the worker's pool holds."""
        description = self.client.description
        return description.num_kv_blocks * description.block_size if description else 0

    def fits(self, num_tokens: int) -> bool:
        """Whether a request that may hold num_tokens of KV fits this worker's pool."""
        return num_tokens <= self.capacity_tokens

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running if self.scheduler else 0

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting if self.scheduler else 0

    @property
    def num_kv_blocks(self) -> int:
        return self.scheduler.block_manager.num_blocks if self.scheduler else 0

    @property
    def num_used_blocks(self) -> int:
        return self.scheduler.block_manager.num_used_blocks if self.scheduler else 0

    @property
    def num_cached_blocks(self) -> int:
        return self.scheduler.block_manager.num_cached_blocks if self.scheduler else 0

    def holds_adapter(self, lora_id: int) -> bool:
        """Whether the adapter is loaded (or loading) on this worker."""
        residency = self.scheduler.adapters if self.scheduler is not None else None
        return residency is not None and residency.holds(lora_id)

    def cached_prefix_tokens(self, token_ids: Sequence[int], root: int | None = None) -> int:
        """Leading tokens of a prompt whose KV this worker's prefix cache holds now.

        Read-only: the same lookup admission makes, without taking the blocks.
        The last token is left out, as admission does: its logits need a forward.
        root: the request's adapter's (prefix_hash.adapter_root); None: the base.
        """
        if not self.connected or self.scheduler is None:
            return 0
        manager = self.scheduler.block_manager
        hashes: list[int] = []
        extend_block_hashes(hashes, token_ids, manager.block_size, root)
        hits = manager.find_cached_prefix(token_ids, hashes, len(token_ids) - 1, root)
        return len(hits) * manager.block_size
