"""Priorities: lower runs first, FCFS within a priority, and a better-priority
waiting request preempts worse running ones when, and only when, that makes room.
"""

from __future__ import annotations

from scheduler_svc.core.request import RequestStatus

from .books import check_books
from .harness import Harness, make_request, unique_prompt


def _admission_order(harness: Harness) -> list[int]:
    order = []
    while harness.step() is not None:
        order += [seq.seq_id for seq in harness.worker.plans[-1].new_sequences]
    return order


def test_lower_priority_values_run_first_and_fcfs_within_a_priority():
    harness = Harness(max_num_seqs=1)
    requests = [
        harness.add(make_request(prompt=unique_prompt(3), max_tokens=2, priority=p))
        for p in (2, 0, 1, 0, -1)
    ]
    late, first, middle, second, urgent = requests
    assert harness.scheduler.waiting == [urgent, first, second, middle, late]
    assert _admission_order(harness) == [r.seq_id for r in (urgent, first, second, middle, late)]


def test_a_better_priority_request_preempts_the_worst_running_one_in_the_same_step():
    # 6 blocks, three low-priority requests with 2 each; `high` needs 2.
    harness = Harness(num_blocks=6)
    lows = [
        harness.add(make_request(prompt=unique_prompt(7), max_tokens=8, priority=5))
        for _ in range(3)
    ]
    harness.step()
    high = harness.add(make_request(prompt=unique_prompt(5), max_tokens=3, priority=0))
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [lows[2].seq_id]
    assert [seq.seq_id for seq in plan.new_sequences] == [high.seq_id]
    assert lows[2].status is RequestStatus.WAITING and lows[2].num_preemptions == 1
    assert harness.scheduler.running[0] is high
    assert harness.scheduler.stats.num_preemptions == 1
    check_books(harness.scheduler)
    harness.run()
    assert harness.final(high.request_id).completion_tokens == 3
    assert all(harness.final(r.request_id).completion_tokens == 8 for r in lows)


def test_a_better_priority_request_preempts_for_a_seat_too():
    harness = Harness(max_num_seqs=2)
    lows = [harness.add(make_request(prompt=3, max_tokens=6, priority=1)) for _ in range(2)]
    harness.step()
    high = harness.add(make_request(prompt=3, max_tokens=2, priority=0))
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [lows[1].seq_id]
    assert [seq.seq_id for seq in plan.new_sequences] == [high.seq_id]
    assert harness.scheduler.running == [high, lows[0]]


def test_equal_priority_never_preempts_to_get_in():
    # Three requests fill the 6 blocks and never need a third one each.
    harness = Harness(num_blocks=6)
    for _ in range(3):
        harness.add(make_request(prompt=unique_prompt(7), max_tokens=2, priority=1))
    harness.step()
    newcomer = harness.add(make_request(prompt=unique_prompt(5), max_tokens=2, priority=1))
    plan = harness.step()
    assert not plan.finished_seq_ids and not plan.new_sequences
    assert newcomer.status is RequestStatus.WAITING
    harness.run()
    assert harness.scheduler.stats.num_preemptions == 0


def test_a_request_that_has_not_sampled_since_admission_is_not_a_priority_victim():
    # `low` prefills its 24 tokens 4 at a time; `high` must wait for its first
    # token, then takes its place.
    harness = Harness(num_blocks=7, max_num_batched_tokens=4)
    low = harness.add(make_request(prompt=unique_prompt(24), max_tokens=4, priority=1))
    harness.step()
    high = harness.add(make_request(prompt=unique_prompt(5), max_tokens=2, priority=0))
    steps = 1
    while low.num_output_tokens == 0:
        assert high.status is RequestStatus.WAITING
        harness.step()
        steps += 1
    assert steps == 6 and low.num_preemptions == 0
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [low.seq_id]
    assert [seq.seq_id for seq in plan.new_sequences] == [high.seq_id]


def test_no_preemption_when_it_would_not_make_room():
    # `candidate` has 2 cache hits on the free list, which use up the 2 free
    # blocks, and needs 2 fresh blocks more. Preempting `low` frees only 1:
    # not enough, so `low` must be left alone.
    harness = Harness(num_blocks=6)
    shared = unique_prompt(8)
    harness.add(make_request(prompt=[*shared, *unique_prompt(1)], max_tokens=1))
    harness.run()
    harness.add(make_request(prompt=unique_prompt(11), max_tokens=10, priority=0))
    low = harness.add(make_request(prompt=unique_prompt(3), max_tokens=10, priority=2))
    harness.step()
    manager = harness.block_manager
    assert (manager.num_free_blocks, manager.num_cached_blocks) == (2, 2)
    candidate = harness.add(
        make_request(prompt=[*shared, *unique_prompt(5)], max_tokens=2, priority=1)
    )
    plan = harness.step()
    assert not plan.finished_seq_ids and low.num_preemptions == 0
    assert candidate.status is RequestStatus.WAITING
    harness.run()
    assert harness.final(candidate.request_id).completion_tokens == 2
    check_books(harness.scheduler)
