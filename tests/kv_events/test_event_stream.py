"""KV events from the real Scheduler on the fake worker: decoded as llm-d decodes them,
chained, and matching the scheduler's own prefix cache after a mixed run with
evictions (no sockets here: test_publisher.py has those)."""

from __future__ import annotations

import pytest

from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.kv_events.replica import ReplicaKVEvents
from scheduler_svc.kv_events.wire import wire_hash
from tests.kv_events.mixed_run import attach, mixed_run, scheduler_view
from tests.kv_events.subscriber import Cleared, Removed, Stored
from tests.scheduler.harness import Harness, make_request, unique_prompt


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_subscribers_view_equals_the_schedulers_cache_through_a_run_with_evictions(
    async_scheduling,
):
    harness = Harness(
        num_blocks=40, block_size=4, max_num_batched_tokens=48, async_scheduling=async_scheduling
    )
    replica, subscriber = attach(harness)
    stats = mixed_run(harness, replica, subscriber, num_requests=150, seed=3)
    view = subscriber.view
    assert stats.checks > 10
    # The pool was too small to keep everything: blocks were evicted and said so.
    assert view.num_removed > 50
    assert view.num_stored >= view.num_removed + len(view.blocks)
    assert view.num_cleared == 1  # the stream opens with it
    assert harness.scheduler.stats.prefix_cache_hits > 0


def test_a_prompt_stores_its_full_blocks_as_one_chain_and_never_its_partial_tail():
    harness = Harness(num_blocks=16, block_size=4)
    replica, subscriber = attach(harness)
    events: list = []
    replica._publish = lambda ts, batch: events.extend(batch)  # the raw events
    prompt = unique_prompt(10)  # two full blocks and a partial one
    harness.add(make_request(prompt, max_tokens=1, ignore_eos=True))
    harness.run()
    replica.flush()
    cleared, stored = events
    assert cleared == ("AllBlocksCleared",)
    tag, hashes, parent, tokens, size, lora_id, medium, lora_name = stored
    assert (tag, parent, size, lora_id, medium, lora_name) == (
        "BlockStored",
        None,
        4,
        None,
        "GPU",
        None,
    )
    assert tokens == prompt[:8] and len(hashes) == 2
    assert set(hashes) == scheduler_view(harness)


def test_a_hit_stores_only_the_new_blocks_chained_on_the_cached_ones():
    harness = Harness(num_blocks=32, block_size=4)
    replica, subscriber = attach(harness)
    shared = unique_prompt(8)
    harness.add(make_request(shared + unique_prompt(1), max_tokens=1, ignore_eos=True))
    harness.run()
    replica.flush()
    first_chain = set(subscriber.view.blocks)
    events: list = []
    replica._publish = lambda ts, batch: events.extend(batch)
    longer = shared + unique_prompt(9)
    harness.add(make_request(longer, max_tokens=1, ignore_eos=True))
    harness.run()
    replica.flush()
    [(tag, hashes, parent, tokens, *_)] = events
    assert tag == "BlockStored" and len(hashes) == 2
    assert parent in first_chain  # the second block of the shared prefix
    assert tokens == longer[8:16]


def test_decoding_gives_the_same_events_positionally_and_by_tag():
    # decode_message asserts the two decodings agree on every batch of a run; here the
    # kinds that must come out of one.
    harness = Harness(num_blocks=12, block_size=4, max_num_batched_tokens=32)
    replica, subscriber = attach(harness)
    kinds: set[type] = set()
    applied = subscriber.view.apply_event

    def record(event) -> None:
        kinds.add(type(event))
        applied(event)

    subscriber.view.apply_event = record
    for _ in range(12):
        harness.add(make_request(unique_prompt(13), max_tokens=2, ignore_eos=True))
        harness.run()
    replica.flush()
    assert kinds == {Cleared, Stored, Removed}


def _manager(replica: ReplicaKVEvents) -> BlockManager:
    return BlockManager(num_blocks=8, block_size=2, events=replica)


def _cache(manager: BlockManager, seq_id: int, tokens: list[int]) -> list[int]:
    from scheduler_svc.core.prefix_hash import extend_block_hashes

    hashes: list[int] = []
    extend_block_hashes(hashes, tokens, manager.block_size)
    manager.allocate(seq_id, len(tokens))
    manager.cache_full_blocks(seq_id, tokens, hashes, len(tokens))
    manager.free(seq_id)
    return hashes


def test_a_replica_of_two_workers_publishes_the_union_of_their_caches():
    batches: list = []
    replica = ReplicaKVEvents(lambda ts, events: batches.append(events))
    first, second = _manager(replica), _manager(replica)
    shared = _cache(first, 1, [5, 6, 7, 8])
    replica.flush()
    assert batches[-1][-1][0] == "BlockStored"
    # The second worker caches the same prefix and one block more: only that one is new.
    both = _cache(second, 1, [5, 6, 7, 8, 9, 10])
    replica.flush()
    [(tag, hashes, parent, *_)] = batches[-1]
    assert (tag, hashes, parent) == ("BlockStored", [wire_hash(both[2])], wire_hash(shared[1]))
    # The first worker is lost: only what the second does not hold leaves the view.
    replica.withdraw(first.cached_block_hashes())
    replica.flush()
    assert len(batches) == 2  # nothing to say: the second still holds all of it
    replica.withdraw(second.cached_block_hashes())
    replica.flush()
    removed, cleared = batches[-1]
    assert removed[0] == "BlockRemoved" and set(removed[1]) == {wire_hash(h) for h in both}
    assert cleared == ("AllBlocksCleared",)
    assert replica.cached_hashes == set()


def test_an_eviction_in_one_worker_is_silent_while_another_holds_the_block():
    batches: list = []
    replica = ReplicaKVEvents(lambda ts, events: batches.extend(events))
    first, second = _manager(replica), _manager(replica)
    hashes = _cache(first, 1, [1, 2, 3, 4])
    _cache(second, 1, [1, 2, 3, 4])
    replica.flush()
    batches.clear()
    # Filling the first worker's pool evicts its cached blocks.
    first.allocate(2, 16)
    replica.flush()
    assert batches == []
    assert replica.cached_hashes == set(hashes)
