"""Paged-KV bookkeeping for one worker's pool, with prefix caching.

The scheduler is the only allocator of KV blocks; a worker writes where the
block tables say. Each block has a reference count (how many live sequences
hold it in their block table). A block that is full and computed is also
registered under its chained hash (see prefix_hash), so that a later sequence
with the same leading tokens can take it instead of recomputing it.

Freed blocks keep their contents and hash: they sit in one free list in
least-recently-freed order and are either found again by hash (a hit takes
them off the list) or, when fresh blocks are needed, evicted from the front
of the list. Freed blocks without a hash (a sequence's partial last block)
go to the front instead: reusing them loses nothing, so no cached prefix is
evicted while one of them is left. So every block is exactly one of:
  used    ref_count > 0 (held by live sequences, possibly several),
  cached  free, still findable by hash,
  empty   free, no hash.

With KV events on (scheduler_svc/kv_events), `events` hears every block that enters
the prefix cache (stored, in chains) and every cached block evicted (removed): the
manager is the one place both happen, so the events are exact.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler_svc.core.block_events import BlockEvents
from scheduler_svc.core.prefix_hash import adapter_root, extend_block_hashes

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request
    from scheduler_svc.lora.registry import AdapterInfo


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    # Set while the block is registered in the prefix cache: its chained hash,
    # the hash of the block before it, and its tokens (checked on every hit, so
    # that a hash collision can never hand out the wrong KV).
    block_hash: int | None = None
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        events: BlockEvents | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [Block(block_id) for block_id in range(num_blocks)]
        # Free blocks, taken from the front: empty ones, then cached ones least
        # recently freed first (evicted first).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._block_tables: dict[int, list[int]] = {}
        # Per sequence: how many leading blocks of its table are registered (or
        # were hits), so that each step registers only the newly filled ones.
        self._num_hashed: dict[int, int] = {}
        # Told of blocks entering and leaving the prefix cache; None: nobody listens.
        self.events = events

    # -- counts --------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can get now: empty ones and cached ones (by eviction)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a findable prefix."""
        return sum(1 for block_id in self._free if self._blocks[block_id].block_hash is not None)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live sequences."""
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens of KV."""
        return -(-num_tokens // self.block_size)

    def has_blocks(self, seq_id: int) -> bool:
        return seq_id in self._block_tables

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._block_tables.get(seq_id, ()))

    @property
    def seq_ids(self) -> tuple[int, ...]:
        """Sequences that hold a block table."""
        return tuple(self._block_tables)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def block_hash(self, block_id: int) -> int | None:
        return self._blocks[block_id].block_hash

    def cached_block_hashes(self) -> set[int]:
        """The hashes the prefix cache holds now (used or free): what KV events describe."""
        return set(self._cached)

    def num_hashed_blocks(self, seq_id: int) -> int:
        """Leading blocks of the sequence's table that are in the prefix cache (or hits)."""
        return self._num_hashed.get(seq_id, 0)

    def num_missing_blocks(self, seq_id: int, num_tokens: int) -> int:
        """Blocks a sequence still lacks to hold num_tokens tokens of KV."""
        have = len(self._block_tables.get(seq_id, ()))
        return max(0, self.blocks_needed(num_tokens) - have)

    # -- prefix cache lookups ------------------------------------------------------------

    def find_cached_prefix(
        self,
        token_ids: Sequence[int],
        block_hashes: Sequence[int],
        max_tokens: int,
        root: int | None = None,
    ) -> list[int]:
        """Ids of the cached blocks that hold the longest prefix of token_ids.

        Only whole blocks within the first max_tokens tokens count; the caller
        passes one less than the tokens it must compute, because the last
        token's logits are needed and only a forward pass gives them.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        # The first block's parent is the adapter's root (prefix_hash.adapter_root).
        parent: int | None = root
        for index in range(min(max_tokens // self.block_size, len(block_hashes))):
            block_id = self._cached.get(block_hashes[index])
            if block_id is None:
                break
            block = self._blocks[block_id]
            start = index * self.block_size
            if block.parent_hash != parent or block.token_ids != tuple(
                token_ids[start : start + self.block_size]
            ):
                break  # a hash collision: treat as a miss
            hits.append(block_id)
            parent = block.block_hash
        return hits

    def can_allocate(self, num_tokens: int, cached_block_ids: Sequence[int] = ()) -> bool:
        return self._num_new_blocks(num_tokens, cached_block_ids) <= self._num_free_after_hits(
            cached_block_ids
        )

    def _num_new_blocks(self, num_tokens: int, cached_block_ids: Sequence[int]) -> int:
        return max(0, self.blocks_needed(num_tokens) - len(cached_block_ids))

    def _num_free_after_hits(self, cached_block_ids: Sequence[int]) -> int:
        # Taking a hit that sits on the free list uses up one free block too.
        return len(self._free) - sum(1 for b in cached_block_ids if self._blocks[b].ref_count == 0)

    # -- allocation ----------------------------------------------------------------------

    def allocate(
        self, seq_id: int, num_tokens: int, cached_block_ids: Sequence[int] = ()
    ) -> list[int]:
        """Starts a block table: the cached prefix blocks, then fresh ones up to num_tokens.

        Returns the whole table.
        """
        if seq_id in self._block_tables:
            raise ValueError(f"sequence {seq_id} already has a block table")
        if not self.can_allocate(num_tokens, cached_block_ids):
            raise RuntimeError(
                f"sequence {seq_id} needs {self._num_new_blocks(num_tokens, cached_block_ids)} "
                f"fresh blocks but only {self._num_free_after_hits(cached_block_ids)} are free"
            )
        for block_id in cached_block_ids:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        table = list(cached_block_ids)
        table += [self._take_free_block() for _ in range(self._num_new_blocks(num_tokens, table))]
        self._block_tables[seq_id] = table
        self._num_hashed[seq_id] = len(cached_block_ids)
        return list(table)

    def can_append_slots(self, seq_id: int, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq_id, num_tokens) <= self.num_free_blocks

    def append_slots(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grows a sequence's table to hold num_tokens tokens; returns the new block ids."""
        table = self._block_tables.get(seq_id)
        if table is None:
            raise KeyError(f"sequence {seq_id} has no block table")
        missing = self.num_missing_blocks(seq_id, num_tokens)
        if missing > self.num_free_blocks:
            raise RuntimeError(
                f"sequence {seq_id} needs {missing} more blocks but only "
                f"{self.num_free_blocks} are free"
            )
        new_block_ids = [self._take_free_block() for _ in range(missing)]
        table.extend(new_block_ids)
        return new_block_ids

    def cache_full_blocks(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        block_hashes: Sequence[int],
        num_computed_tokens: int,
        adapter: AdapterInfo | None = None,
    ) -> None:
        """Registers the sequence's blocks that are now full and computed (under
        `adapter`, whose root the first block's hash was chained from)."""
        if not self.enable_prefix_caching:
            return
        table = self._block_tables[seq_id]
        num_full = min(num_computed_tokens // self.block_size, len(block_hashes), len(table))
        first = self._num_hashed[seq_id]
        registered: list[int] = []
        for index in range(first, num_full):
            block_hash = block_hashes[index]
            if block_hash in self._cached:
                continue  # computed twice concurrently; the first copy stays the cached one
            block = self._blocks[table[index]]
            start = index * self.block_size
            block.block_hash = block_hash
            block.parent_hash = block_hashes[index - 1] if index else adapter_root(adapter)
            block.token_ids = tuple(token_ids[start : start + self.block_size])
            self._cached[block_hash] = block.block_id
            registered.append(index)
        self._num_hashed[seq_id] = max(self._num_hashed[seq_id], num_full)
        if self.events is not None and registered:
            self._announce(registered, block_hashes, token_ids, adapter)

    def _announce(
        self, indices: list[int], block_hashes: Sequence[int], token_ids: Sequence[int], adapter
    ) -> None:
        """Tells events of the blocks just registered: one chain per run of consecutive
        indices (a block another copy already holds splits a run)."""
        size = self.block_size
        run_start = 0
        for position in range(1, len(indices) + 1):
            if position < len(indices) and indices[position] == indices[position - 1] + 1:
                continue
            first, last = indices[run_start], indices[position - 1]
            self.events.stored(
                block_hashes[first : last + 1],
                block_hashes[first - 1] if first else None,
                token_ids[first * size : (last + 1) * size],
                size,
                adapter,
            )
            run_start = position

    def free(self, seq_id: int) -> None:
        """Drops a sequence's table; blocks nobody else holds return to the free list."""
        table = self._block_tables.pop(seq_id, None)
        if table is None:
            raise KeyError(f"sequence {seq_id} has no block table")
        del self._num_hashed[seq_id]
        # Tail first, so that the tail (the part least likely to be shared by a
        # later request) is evicted before the head.
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        # A free block with holders would be handed out twice.
        assert block.ref_count == 0, f"block {block_id} is on the free list with holders"
        if block.block_hash is not None:
            # Evicted: its old contents are about to be overwritten.
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
                if self.events is not None:
                    self.events.removed(block.block_hash)
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()
        block.ref_count = 1
        return block_id

    def cache_computed_blocks(self, request: Request) -> None:
        """Registers the blocks the request's last step filled, so that later requests
        can share them (a no-op without prefix caching or a newly full block)."""
        num_full = request.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= self.num_hashed_blocks(request.seq_id):
            return
        token_ids = request.all_token_ids
        root = adapter_root(request.adapter)
        extend_block_hashes(request.block_hashes, token_ids, self.block_size, root)
        self.cache_full_blocks(
            request.seq_id,
            token_ids,
            request.block_hashes,
            request.num_computed_tokens,
            request.adapter,
        )
