"""No head-of-line blocking, and no starvation: the bypass rule.

A waiting request that does not fit lets the requests behind it in, but
only `max_bypasses` of them: then the queue stops at it until it fits, which
it does once running requests finish. So it waits behind at most
`max_bypasses` later requests plus what was running when it arrived.
"""

from __future__ import annotations

from scheduler_svc.core.request import RequestStatus

from .harness import Harness, make_request, unique_prompt


def _blocked_queue(max_bypasses: int, num_small: int):
    """8 blocks: `hog` holds 4 (and grows to 5), `big` needs 5, smalls 1 each."""
    harness = Harness(num_blocks=8, max_bypasses=max_bypasses)
    hog = harness.add(make_request(prompt=unique_prompt(16), max_tokens=4))
    big = harness.add(make_request(prompt=unique_prompt(17), max_tokens=2))
    smalls = [
        harness.add(make_request(prompt=unique_prompt(2), max_tokens=2)) for _ in range(num_small)
    ]
    return harness, hog, big, smalls


def _running(requests) -> list[bool]:
    return [request.status is RequestStatus.RUNNING for request in requests]


def test_smaller_requests_pass_one_that_does_not_fit():
    harness, hog, big, smalls = _blocked_queue(max_bypasses=16, num_small=3)
    harness.step()
    assert big.status is RequestStatus.WAITING
    assert _running(smalls) == [True, True, True]
    assert big.num_bypassed == 3
    harness.run()
    assert all(harness.finished(r.request_id) for r in (hog, big, *smalls))


def test_after_max_bypasses_nothing_passes_until_it_fits():
    harness, hog, big, smalls = _blocked_queue(max_bypasses=2, num_small=4)
    plan = harness.step()
    # Two pass in the same pass that finds `big` too large, not four.
    assert _running(smalls) == [True, True, False, False]
    assert big.num_bypassed == 2
    assert len(plan.new_sequences) == 3
    # The smalls left would fit beside `hog` all along, but wait for `big`,
    # which gets in the step after `hog` finishes.
    while hog.status is RequestStatus.RUNNING:
        harness.step()
        assert _running(smalls[2:]) == [False, False] and big.status is RequestStatus.WAITING
    plan = harness.step()
    assert plan.new_sequences[0].seq_id == big.seq_id
    harness.run()
    admitted = [seq.seq_id for plan in harness.worker.plans for seq in plan.new_sequences]
    assert admitted.index(big.seq_id) < admitted.index(smalls[2].seq_id)
    assert all(harness.finished(r.request_id) for r in (hog, big, *smalls))


def test_zero_bypasses_is_strict_first_come_first_served():
    harness, hog, big, smalls = _blocked_queue(max_bypasses=0, num_small=2)
    harness.step()
    assert _running([hog, big, *smalls]) == [True, False, False, False]
    assert big.num_bypassed == 0


def test_the_bypass_count_carries_over_from_step_to_step():
    harness, hog, big, smalls = _blocked_queue(max_bypasses=3, num_small=2)
    harness.step()
    assert big.num_bypassed == 2
    late = harness.add(make_request(prompt=unique_prompt(2), max_tokens=2))
    later = harness.add(make_request(prompt=unique_prompt(2), max_tokens=2))
    harness.step()
    assert _running([late, later]) == [True, False] and big.num_bypassed == 3
    harness.run()
    assert big.num_preemptions == 0 and harness.final(big.request_id).completion_tokens == 2


def test_a_waiting_request_of_better_priority_is_bypassed_only_up_to_the_limit_too():
    harness = Harness(num_blocks=8, max_bypasses=1)
    harness.add(make_request(prompt=unique_prompt(16), max_tokens=4, priority=0))
    urgent = harness.add(make_request(prompt=unique_prompt(17), max_tokens=2, priority=0))
    lows = [
        harness.add(make_request(prompt=unique_prompt(2), max_tokens=2, priority=3))
        for _ in range(2)
    ]
    harness.step()
    # It cannot preempt `hog` (same priority): one low passes it, not two.
    assert _running(lows) == [True, False] and urgent.num_bypassed == 1
