"""Paged-KV bookkeeping for one worker's pool: which block belongs to whom.

The scheduler is the only allocator of KV blocks; a worker writes where the
block tables say. This is plain bookkeeping in nano-vllm's spirit: a free
list, a reference count per block and a block table per sequence, with the
verbs can_allocate / allocate, can_append_slots / append_slots and free.

Blocks carry reference counts so that prefix caching (a later issue) can share
a full block between sequences and keep freed blocks findable by a chained
hash until they are reused: freed blocks go to the back of the free list and
allocation takes from the front, which is already least-recently-freed order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    # Sequences whose block table holds this block; 0 means it is on the free list.
    ref_count: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._blocks = [Block(block_id) for block_id in range(num_blocks)]
        self._free_block_ids: deque[int] = deque(range(num_blocks))
        self._block_tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_block_ids)

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

    def num_missing_blocks(self, seq_id: int, num_tokens: int) -> int:
        """Blocks a sequence still lacks to hold num_tokens tokens of KV."""
        have = len(self._block_tables.get(seq_id, ()))
        return max(0, self.blocks_needed(num_tokens) - have)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Starts a block table that holds num_tokens tokens; returns its block ids."""
        if seq_id in self._block_tables:
            raise ValueError(f"sequence {seq_id} already has a block table")
        self._block_tables[seq_id] = []
        return self.append_slots(seq_id, num_tokens)

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

    def free(self, seq_id: int) -> None:
        """Drops a sequence's table; blocks nobody else holds return to the free list."""
        table = self._block_tables.pop(seq_id, None)
        if table is None:
            raise KeyError(f"sequence {seq_id} has no block table")
        # Reversed, so that a sequence's tail (the least likely to be shared by a
        # future prefix) is reused before its head.
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free_block_ids.append(block_id)

    def _take_free_block(self) -> int:
        block_id = self._free_block_ids.popleft()
        block = self._blocks[block_id]
        # A free block with holders would be handed out twice.
        assert block.ref_count == 0, f"block {block_id} is on the free list with holders"
        block.ref_count = 1
        return block_id
