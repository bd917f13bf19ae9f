"""What hears a block manager's prefix cache change: the KV events of the replica
(kv_events.replica.ReplicaKVEvents); its own module so that the block manager stays
plain bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler_svc.lora.registry import AdapterInfo


class BlockEvents(Protocol):
    def stored(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        adapter: AdapterInfo | None = None,
    ) -> None:
        """Full blocks entering the prefix cache, a chain (computed under `adapter`)."""

    def removed(self, block_hash: int) -> None: ...
