"""Chained block hashes: the identity of a full KV block in the prefix cache.

Block i of a sequence is named by hash(hash of block i-1, its block_size token
ids), so equal hashes mean equal tokens from the first position up to the end
of the block, which is exactly when two sequences' KV for that block agree
(attention sees every earlier token). Python's hash of a tuple of ints is the
same in every process and run; the block manager also compares the tokens on
a hit, so a collision costs a miss, never wrong KV.
"""

from __future__ import annotations

from collections.abc import Sequence

# Parent of the first block; any fixed value works.
ROOT_HASH = 0x6362_7365_7276_65


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    return hash((ROOT_HASH if parent_hash is None else parent_hash, tuple(token_ids)))


def extend_block_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int) -> None:
    """Appends the hashes of the full blocks of token_ids that `hashes` lacks.

    A sequence's tokens only ever grow, so its hashes are computed once each.
    """
    for index in range(len(hashes), len(token_ids) // block_size):
        start = index * block_size
        parent = hashes[index - 1] if index else None
        hashes.append(block_hash(parent, token_ids[start : start + block_size]))
