"""Prefix caching: chained block hashes, sharing by reference count, LRU eviction.

First the block manager alone, then through the scheduler, where the fake
worker checks that every hit holds exactly the KV the request would have
computed itself.
"""

from __future__ import annotations

from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.prefix_hash import extend_block_hashes

from .books import check_books
from .harness import Harness, encode, make_request, unique_prompt

SIZE = 4


def _hashes(token_ids: list[int]) -> list[int]:
    hashes: list[int] = []
    extend_block_hashes(hashes, token_ids, SIZE)
    return hashes


def _computed(manager: BlockManager, seq_id: int, token_ids: list[int]) -> list[int]:
    """Allocates a sequence and registers its full blocks, as if a step computed them."""
    table = manager.allocate(seq_id, len(token_ids))
    manager.cache_full_blocks(seq_id, token_ids, _hashes(token_ids), len(token_ids))
    return table


def _lookup(manager: BlockManager, token_ids: list[int]) -> list[int]:
    return manager.find_cached_prefix(token_ids, _hashes(token_ids), len(token_ids) - 1)


def test_full_blocks_are_found_by_their_chained_hash_and_shared():
    manager = BlockManager(8, SIZE)
    tokens = list(range(10))
    table = _computed(manager, 1, tokens)
    # Two full blocks are registered; the partial third is not.
    assert [manager.block_hash(b) is not None for b in table] == [True, True, False]
    assert _lookup(manager, tokens) == table[:2]
    # A different first block changes the chain: equal later tokens do not match.
    assert _lookup(manager, [99, *tokens[1:]]) == []
    assert _lookup(manager, [*tokens[:4], 99, *tokens[5:]]) == table[:1]
    # A hit on a live block shares it.
    shared = manager.allocate(2, 9, table[:2])
    assert shared[:2] == table[:2] and shared[2] != table[2]
    assert [manager.ref_count(b) for b in table] == [2, 2, 1]
    manager.free(1)
    assert [manager.ref_count(b) for b in shared] == [1, 1, 1]


def test_the_last_token_is_never_covered_by_a_hit():
    manager = BlockManager(8, SIZE)
    tokens = list(range(8))
    table = _computed(manager, 1, tokens)
    # Both blocks are cached, but the 8th token's logits must be computed.
    assert _lookup(manager, tokens) == table[:1]
    assert _lookup(manager, [*tokens, 50]) == table


def test_a_hash_collision_is_a_miss_not_wrong_kv():
    manager = BlockManager(8, SIZE)
    _computed(manager, 1, [1, 2, 3, 4, 5])
    other = [7, 7, 7, 7, 5]
    # Pretend `other`'s first block hashes like the cached one.
    assert manager.find_cached_prefix(other, _hashes([1, 2, 3, 4, 5]), 4) == []


def test_freed_blocks_keep_their_hash_and_a_hit_takes_them_back():
    manager = BlockManager(4, SIZE)
    tokens = list(range(9))
    table = _computed(manager, 1, tokens)
    manager.free(1)
    assert (manager.num_used_blocks, manager.num_cached_blocks, manager.num_free_blocks) == (
        0,
        2,
        4,
    )
    assert all(manager.block_hash(b) is not None for b in table[:2])
    hits = _lookup(manager, tokens)
    assert hits == table[:2]
    # The hits come off the free list too: 3 blocks taken, 2 of them hits.
    assert manager.can_allocate(9 + 4, hits) and not manager.can_allocate(9 + 8, hits)
    assert manager.allocate(2, 9, hits)[:2] == hits
    assert (manager.num_used_blocks, manager.num_cached_blocks) == (3, 0)


def test_eviction_takes_empty_blocks_then_the_least_recently_freed_tail_first():
    manager = BlockManager(7, SIZE)
    old = _computed(manager, 1, list(range(8)))  # 2 cached blocks
    new = _computed(manager, 2, list(range(50, 58)))  # 2 cached blocks
    _computed(manager, 3, [90, 91])  # a partial block: no hash
    for seq_id in (1, 2, 3):
        manager.free(seq_id)
    # 2 never used + 1 emptied, then old's tail, old's head, new's tail, new's head.
    assert len(manager.allocate(4, 3 * SIZE)) == 3
    assert manager.num_cached_blocks == 4
    manager.allocate(5, SIZE)
    assert manager.block_hash(old[1]) is None and manager.block_hash(old[0]) is not None
    manager.allocate(6, SIZE)
    assert _lookup(manager, list(range(9))) == []
    assert _lookup(manager, list(range(50, 59))) == new


def test_a_block_computed_twice_is_registered_once():
    manager = BlockManager(8, SIZE)
    tokens = list(range(5))
    first = _computed(manager, 1, tokens)
    second = _computed(manager, 2, tokens)
    assert manager.block_hash(first[0]) is not None and manager.block_hash(second[0]) is None
    manager.free(2)
    assert manager.num_cached_blocks == 0 and _lookup(manager, tokens) == first[:1]


def test_disabled_prefix_caching_registers_and_finds_nothing():
    manager = BlockManager(8, SIZE, enable_prefix_caching=False)
    tokens = list(range(9))
    _computed(manager, 1, tokens)
    manager.free(1)
    assert manager.num_cached_blocks == 0 and _lookup(manager, tokens) == []


# -- through the scheduler ---------------------------------------------------------------

SHARED = unique_prompt(13)
WORDS = encode(" the cat sat on the mat")


def _two_requests(**config) -> tuple[Harness, object, object]:
    """A request, then after it finished another with the same first 13 tokens."""
    harness = Harness(**config)
    first = harness.add(make_request(prompt=[*SHARED, 1], max_tokens=3), tokens=WORDS)
    harness.run()
    second = harness.add(make_request(prompt=[*SHARED, 2, 3], max_tokens=6), tokens=WORDS)
    return harness, first, second


def test_a_later_request_reuses_the_full_blocks_of_a_finished_one():
    harness, first, second = _two_requests()
    assert harness.final(first.request_id).cached_prompt_tokens == 0
    written = harness.worker.num_slots_written
    plan = harness.step()
    [seq] = plan.new_sequences
    # Three full blocks of the shared 13 tokens; the worker checked their KV.
    assert (seq.num_computed_tokens, seq.num_scheduled_tokens) == (12, 3)
    assert harness.worker.num_slots_written - written == 3
    harness.run()
    assert harness.final(second.request_id).cached_prompt_tokens == 12
    stats = harness.scheduler.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (14 + 15, 12)
    # The same tokens as without the cache.
    reference, _, again = _two_requests(enable_prefix_caching=False)
    reference.run()
    assert harness.token_ids(second.request_id) == reference.token_ids(again.request_id)
    assert reference.final(again.request_id).cached_prompt_tokens == 0
    assert reference.scheduler.stats.prefix_cache_hits == 0
    assert reference.block_manager.num_cached_blocks == 0


def test_running_requests_share_blocks_and_nobody_writes_a_shared_one():
    harness = Harness(max_num_batched_tokens=8)
    first = harness.add(make_request(prompt=[*SHARED, 1], max_tokens=8), tokens=WORDS)
    harness.step()  # 8 of its 14 prompt tokens computed: blocks 0 and 1 are registered
    second = harness.add(make_request(prompt=[*SHARED, 2], max_tokens=8), tokens=WORDS)
    plan = harness.step()
    [seq] = plan.new_sequences
    assert seq.num_computed_tokens == 8
    shared = harness.block_manager.block_table(first.seq_id)[:2]
    assert harness.block_manager.block_table(second.seq_id)[:2] == shared
    assert [harness.block_manager.ref_count(b) for b in shared] == [2, 2]
    check_books(harness.scheduler)
    # Block 2 is computed by both: it was not full when `second` was admitted.
    while harness.step() is not None:
        check_books(harness.scheduler)
    assert harness.token_ids(first.request_id) == harness.token_ids(second.request_id)
    assert harness.final(second.request_id).cached_prompt_tokens == 8
