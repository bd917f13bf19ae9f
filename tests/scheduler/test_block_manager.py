from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.core.block_manager import BlockManager


def _make_block_manager(num_blocks: int = 8, block_size: int = 4) -> BlockManager:
    return BlockManager(num_blocks, block_size)


def test_blocks_needed_rounds_up():
    manager = _make_block_manager(block_size=4)
    assert [manager.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_then_append_grows_only_at_block_boundaries():
    manager = _make_block_manager(num_blocks=8, block_size=4)
    first = manager.allocate(seq_id=1, num_tokens=5)
    assert len(first) == 2
    assert manager.append_slots(1, 8) == []
    third = manager.append_slots(1, 9)
    assert len(third) == 1
    assert manager.block_table(1) == (*first, *third)
    assert manager.num_used_blocks == 3
    assert manager.num_free_blocks == 5
    assert all(manager.ref_count(block_id) == 1 for block_id in manager.block_table(1))


def test_free_returns_every_block():
    manager = _make_block_manager(num_blocks=8)
    manager.allocate(1, 10)
    manager.allocate(2, 3)
    manager.free(1)
    assert not manager.has_blocks(1)
    assert manager.num_used_blocks == 1
    manager.free(2)
    assert manager.num_free_blocks == 8
    assert all(manager.ref_count(block_id) == 0 for block_id in range(8))


def test_can_allocate_and_can_append_track_free_blocks():
    manager = _make_block_manager(num_blocks=4, block_size=4)
    assert manager.can_allocate(16)
    assert not manager.can_allocate(17)
    manager.allocate(1, 12)
    assert manager.can_append_slots(1, 16)
    assert not manager.can_append_slots(1, 17)
    assert manager.num_missing_blocks(1, 17) == 2
    with pytest.raises(RuntimeError, match="needs 2 more blocks"):
        manager.append_slots(1, 17)
    # A refused request leaves the table as it was.
    assert len(manager.block_table(1)) == 3


def test_misuse_is_refused():
    manager = _make_block_manager()
    manager.allocate(1, 4)
    with pytest.raises(ValueError, match="already has a block table"):
        manager.allocate(1, 4)
    with pytest.raises(KeyError):
        manager.append_slots(2, 4)
    with pytest.raises(KeyError):
        manager.free(2)
    manager.free(1)
    with pytest.raises(KeyError):
        manager.free(1)


def test_rejects_empty_pool():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)


@settings(max_examples=60, deadline=None)
@given(
    operations=st.lists(
        st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(0, 12)),
        max_size=60,
    )
)
def test_random_operations_never_hand_out_a_block_twice(operations):
    manager = _make_block_manager(num_blocks=10, block_size=3)
    tokens: dict[int, int] = {}
    for verb, seq_id, count in operations:
        if verb == "free":
            if seq_id in tokens:
                manager.free(seq_id)
                del tokens[seq_id]
            continue
        wanted = tokens.get(seq_id, 0) + count
        if not manager.can_append_slots(seq_id, wanted):
            continue
        if seq_id in tokens:
            manager.append_slots(seq_id, wanted)
        else:
            manager.allocate(seq_id, wanted)
        tokens[seq_id] = wanted
        owned = [block_id for seq in tokens for block_id in manager.block_table(seq)]
        assert len(owned) == len(set(owned)) == manager.num_used_blocks
        assert manager.num_used_blocks + manager.num_free_blocks == 10
        for seq, count_held in tokens.items():
            assert len(manager.block_table(seq)) == manager.blocks_needed(count_held)
    for seq_id in list(tokens):
        manager.free(seq_id)
    assert manager.num_free_blocks == 10
