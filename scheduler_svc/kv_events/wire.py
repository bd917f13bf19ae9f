"""The events as they go on the wire: vLLM's msgpack encoding, field for field.

vLLM declares its events as msgspec Structs with `array_like=True` and `tag=True`, so
an event is a msgpack array whose first element is the class name and whose other
elements are the fields in declaration order, and a batch is the array
`[ts, [events], data_parallel_rank]`:

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
     lora_id, medium, lora_name]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Fields with defaults (extra_keys, group_idx, ...) are left off the end, as msgspec's
omit_defaults does. llm-d reads these positionally (the tag, then the fields in order);
its older indexer split off the tag and decoded the rest as an array: both work here.

A block hash is the scheduler's own chained hash (core/prefix_hash.py) as an unsigned
64-bit integer, the form llm-d turns every hash into; the first block of a chain has
no parent (nil). llm-d keys its index by hashes it computes from the token ids, and
keeps ours only to find a block again when it is removed, so ours need only be
consistent within this stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

BLOCK_STORED, BLOCK_REMOVED, ALL_BLOCKS_CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"
# vLLM's name for the tier its scheduler's own KV pool is in; llm-d lowercases it and
# weighs its tiers by name ("gpu" first). A replica's KV pool is its primary tier, on
# whatever device the workers run: naming it otherwise would rank it below a CPU
# offload tier of another engine.
MEDIUM = "GPU"
# The replica is one data-parallel rank as vLLM counts them.
DATA_PARALLEL_RANK = 0
_UINT64 = (1 << 64) - 1

Event = tuple


def wire_hash(block_hash: int) -> int:
    """A Python hash (signed 64-bit) as the unsigned 64-bit integer consumers read."""
    return block_hash & _UINT64


def block_stored(
    block_hashes: Sequence[int],
    parent_hash: int | None,
    token_ids: Sequence[int],
    block_size: int,
    lora_id: int | None = None,
    lora_name: str | None = None,
) -> Event:
    """Full blocks entering the prefix cache, a chain: each block's parent is the one
    before it, the first one's is parent_hash (None: the chain starts at the prompt's
    first token). token_ids are all their tokens, block after block. lora_id and
    lora_name: the adapter they were computed under (None: the base model), as vLLM's."""
    return (
        BLOCK_STORED,
        [wire_hash(h) for h in block_hashes],
        None if parent_hash is None else wire_hash(parent_hash),
        list(token_ids),
        block_size,
        lora_id,
        MEDIUM,
        lora_name,
    )


def block_removed(block_hashes: Sequence[int]) -> Event:
    return (BLOCK_REMOVED, [wire_hash(h) for h in block_hashes], MEDIUM)


def all_blocks_cleared() -> Event:
    return (ALL_BLOCKS_CLEARED,)


def encode_batch(ts: float, events: Sequence[Event]) -> bytes:
    """One batch, the payload frame of a message."""
    return msgpack.packb([ts, list(events), DATA_PARALLEL_RANK], use_bin_type=True)
