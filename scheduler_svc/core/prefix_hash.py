"""Chained block hashes: the identity of a full KV block in the prefix cache.

Block i of a sequence is named by hash(hash of block i-1, its block_size token
ids), so equal hashes mean equal tokens from the first position up to the end
of the block, which is exactly when two sequences' KV for that block agree
(attention sees every earlier token). Python's hash of a tuple of ints is the
same in every process and run; the block manager also compares the tokens on
a hit, so a collision costs a miss, never wrong KV.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler_svc.lora.registry import AdapterInfo

# Parent of the first block; any fixed value works.
ROOT_HASH = 0x6362_7365_7276_65


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    return hash((ROOT_HASH if parent_hash is None else parent_hash, tuple(token_ids)))


def adapter_root(adapter: AdapterInfo | None) -> int | None:
    """The parent of a sequence's first block: None for the base model; for a LoRA
    adapter a hash of its name and lora_id, so that no block computed under one adapter
    (or the base) is ever found by a request of another."""
    if adapter is None:
        return None
    # A digest, not hash(str): a string's hash differs between processes.
    name = int.from_bytes(hashlib.blake2b(adapter.name.encode(), digest_size=8).digest(), "little")
    return hash((ROOT_HASH, name, adapter.lora_id))


def extend_block_hashes(
    hashes: list[int], token_ids: Sequence[int], block_size: int, root: int | None = None
) -> None:
    """Appends the hashes of the full blocks of token_ids that `hashes` lacks; root is
    the first block's parent (adapter_root).

    A sequence's tokens only ever grow, so its hashes are computed once each.
    """
    for index in range(len(hashes), len(token_ids) // block_size):
        start = index * block_size
        parent = hashes[index - 1] if index else root
        hashes.append(block_hash(parent, token_ids[start : start + block_size]))
