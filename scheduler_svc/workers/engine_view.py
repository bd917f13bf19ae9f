"""What placement and the metrics read of an engine: its load, its pool, its cache.

Read-only views over the engine's scheduler and its worker's description, kept
apart from the step loop (a mixin of WorkerEngine); all of them read 0 while
the engine has no scheduler (before it connects).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.core.prefix_hash import extend_block_hashes


class EngineView:
    @property
    def connected(self) -> bool:
        return self._connected

    def holds(self, request_id: str) -> bool:
        return request_id in self._handles

    @property
    def capacity_tokens(self) -> int:
        """Tokens of KV the worker's pool holds (0 before it has described itself)."""
        description = self.client.description
        return description.num_kv_blocks * description.block_size if description else 0

    @property
    def load(self) -> int:
        return len(self._handles)

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

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of a prompt whose KV this worker's prefix cache holds now.

        Read-only: the same lookup admission makes, without taking the blocks.
        The last token is left out, as admission does: its logits need a forward.
        """
        if not self.connected or self.scheduler is None:
            return 0
        manager = self.scheduler.block_manager
        hashes: list[int] = []
        extend_block_hashes(hashes, token_ids, manager.block_size)
        hits = manager.find_cached_prefix(token_ids, hashes, len(token_ids) - 1)
        return len(hits) * manager.block_size

    def fits(self, num_tokens: int) -> bool:
        """Whether a request that may hold num_tokens of KV fits this worker's pool."""
        return num_tokens <= self.capacity_tokens

    def _next_deadline(self) -> float | None:
        deadlines = [
            request.deadline
            for request in (*self.scheduler.waiting, *self.scheduler.running)
            if request.deadline is not None
        ]
        return min(deadlines, default=None)
