"""Preemption by recompute: who is the victim, where it waits, how it resumes.

Blocks of 4 tokens and unique prompts (no prefix-cache hits) unless a test
says otherwise, so that block counts are easy to follow by hand.
"""

from __future__ import annotations

import grpc

from scheduler_svc.core.request import FinishReason, RequestStatus

from .books import check_books
from .harness import Harness, encode, make_request, unique_prompt

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve")


def _scheduled(plan) -> dict[int, int]:
    return {
        s.seq_id: s.num_scheduled_tokens for s in [*plan.new_sequences, *plan.continuing_sequences]
    }


def _three_requests(harness: Harness, priorities=(0, 0, 0), max_tokens=8):
    """Three requests of 7 prompt tokens (2 blocks each) that fill a 6-block pool."""
    return [
        harness.add(
            make_request(prompt=unique_prompt(7), max_tokens=max_tokens, priority=p), tokens=WORDS
        )
        for p in priorities
    ]


def test_the_victim_is_the_latest_arrival_and_it_goes_back_to_waiting():
    harness = Harness(num_blocks=6)
    first, second, third = _three_requests(harness)
    harness.step()  # 7 prompt tokens each, + 1 sampled: 8 tokens in 2 blocks
    harness.step()  # position 7 still fits the second block; now 9 tokens each
    assert harness.block_manager.num_free_blocks == 0
    plan = harness.step()  # `first` needs a third block: `third` is preempted
    assert list(plan.finished_seq_ids) == [third.seq_id]
    assert _scheduled(plan) == {first.seq_id: 1, second.seq_id: 1}
    assert third.status is RequestStatus.WAITING and harness.scheduler.waiting == [third]
    assert (third.num_preemptions, third.num_computed_tokens) == (1, 0)
    assert not harness.block_manager.has_blocks(third.seq_id)
    assert (first.num_preemptions, second.num_preemptions) == (0, 0)
    assert harness.scheduler.stats.num_preemptions == 1
    check_books(harness.scheduler)


def test_the_victim_is_the_lowest_priority_before_the_latest_arrival():
    harness = Harness(num_blocks=6)
    low, first, second = _three_requests(harness, priorities=(1, 0, 0))
    for _ in range(3):
        plan = harness.step()
    assert list(plan.finished_seq_ids) == [low.seq_id]
    assert low.num_preemptions == 1 and low.status is RequestStatus.WAITING
    assert {first.status, second.status} == {RequestStatus.RUNNING}


def test_a_victim_waits_at_the_front_of_its_priority_ahead_of_earlier_arrivals():
    harness = Harness(num_blocks=6)
    first = harness.add(make_request(prompt=unique_prompt(7), max_tokens=8, arrival_time=0))
    second = harness.add(make_request(prompt=unique_prompt(7), max_tokens=8, arrival_time=1))
    # `big` arrived before `third` but does not fit; `third` is admitted past it.
    big = harness.add(make_request(prompt=unique_prompt(20), max_tokens=2, arrival_time=2))
    third = harness.add(make_request(prompt=unique_prompt(7), max_tokens=8, arrival_time=3))
    worse = harness.add(
        make_request(prompt=unique_prompt(3), max_tokens=2, arrival_time=0, priority=1)
    )
    harness.step()
    assert third.status is RequestStatus.RUNNING and big.num_bypassed == 1
    harness.step()
    harness.step()  # `third` is preempted
    assert third.num_preemptions == 1
    # Preempted first within its priority, whatever the arrivals; priority first.
    assert harness.scheduler.waiting == [third, big, worse]
    assert {first.status, second.status} == {RequestStatus.RUNNING}


def test_a_resumed_request_recomputes_its_prompt_and_output_and_continues():
    harness = Harness(num_blocks=6, enable_prefix_caching=False)
    first, second, third = _three_requests(harness)
    for _ in range(3):
        harness.step()
    seen = list(harness.token_ids(third.request_id))
    assert third.output_token_ids == seen == WORDS[:2]
    # It comes back when `first` and `second` finish and give their blocks back.
    while third.status is RequestStatus.WAITING:
        plan = harness.step()
    [resumed] = plan.new_sequences
    assert resumed.seq_id == third.seq_id
    assert list(resumed.prompt_token_ids) == third.prompt_token_ids
    assert list(resumed.output_token_ids) == seen
    # Everything is recomputed: prompt and output, in blocks for all of it.
    assert resumed.num_computed_tokens == 0 and resumed.num_scheduled_tokens == 9
    assert len(resumed.block_ids) == 3
    harness.run()
    for request in (first, second, third):
        assert harness.token_ids(request.request_id) == WORDS[:8]
        assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    assert third.num_preemptions == 1


def test_a_resumed_request_finds_its_own_blocks_in_the_prefix_cache():
    # 7 blocks: after the three prefills, `first` takes the spare block and
    # `second` preempts `third`, whose blocks are freed tail first: `second`
    # takes the tail, the head keeps its KV and hash until `third` resumes.
    harness = Harness(num_blocks=7)
    first, second, third = _three_requests(harness, max_tokens=3)
    for _ in range(3):
        harness.step()
    assert third.num_preemptions == 1
    # `first` and `second` finished in that step: 2 full blocks each, plus the head.
    assert harness.block_manager.num_cached_blocks == 5
    plan = harness.step()
    [resumed] = plan.new_sequences
    assert resumed.seq_id == third.seq_id
    # One block found; the rest of prompt and output recomputed, and the
    # worker checked that the block it found holds exactly this KV.
    assert (resumed.num_computed_tokens, resumed.num_scheduled_tokens) == (4, 5)
    assert harness.scheduler.stats.prefix_cache_hits == 4
    harness.run()
    assert harness.token_ids(third.request_id) == WORDS[:3]
    # Hits on resume are not prompt tokens the client is told were cached.
    assert harness.final(third.request_id).cached_prompt_tokens == 0


def _workload(num_blocks: int, **config) -> tuple[Harness, list]:
    harness = Harness(num_blocks=num_blocks, max_num_batched_tokens=12, **config)
    requests = []
    for index in range(6):
        request = make_request(
            prompt=[7000 + 10 * index + k for k in range(3 + 2 * index)],
            max_tokens=6 + index,
            priority=index % 2,
        )
        requests.append(harness.add(request, tokens=WORDS[index:]))
    return harness, requests


def test_the_client_sees_every_token_exactly_once_as_on_a_big_pool():
    for caching in (True, False):
        big, expected = _workload(num_blocks=64, enable_prefix_caching=caching)
        big.run()
        assert big.scheduler.stats.num_preemptions == 0
        small, requests = _workload(num_blocks=8, enable_prefix_caching=caching)
        for _ in range(500):
            if small.step() is None:
                break
            check_books(small.scheduler)
        assert small.scheduler.stats.num_preemptions >= 4
        assert any(request.num_preemptions >= 2 for request in requests)
        for request, reference in zip(requests, expected, strict=True):
            assert small.token_ids(request.request_id) == big.token_ids(reference.request_id)
            assert small.text(request.request_id) == big.text(reference.request_id)
            assert request.num_preemptions <= request.num_output_tokens
        assert small.block_manager.num_used_blocks == 0 and small.worker.sequences == {}


def test_a_request_that_was_just_admitted_is_not_preempted_before_it_samples():
    # `early` decodes; `late` is admitted into the last two blocks and prefills
    # in chunks. When `early` needs a block, `late` is the latest arrival but
    # has not sampled since its admission: `early` preempts itself instead.
    harness = Harness(num_blocks=3, max_num_batched_tokens=4)
    early = harness.add(make_request(prompt=unique_prompt(3), max_tokens=8), tokens=WORDS)
    harness.step()
    late = harness.add(make_request(prompt=unique_prompt(8), max_tokens=4), tokens=WORDS)
    harness.step()
    assert late.status is RequestStatus.RUNNING and late.num_computed_tokens == 3
    assert harness.block_manager.num_free_blocks == 0
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [early.seq_id]
    assert _scheduled(plan) == {late.seq_id: 4}
    assert (early.num_preemptions, late.num_preemptions) == (1, 0)
    harness.run()
    assert harness.token_ids(early.request_id) == WORDS[:8]
    assert harness.token_ids(late.request_id) == WORDS[:4]
    assert late.num_preemptions == 0


def test_a_request_that_outgrows_the_whole_pool_fails_instead_of_looping():
    harness = Harness(num_blocks=2)
    request = harness.add(make_request(prompt=unique_prompt(6), max_tokens=10))
    for _ in range(3):
        harness.step()  # 6 prompt tokens, then decodes up to 8 tokens of KV
    assert request.num_output_tokens == 3 and request.status is RequestStatus.RUNNING
    plan = harness.step()  # the 9th token needs a third block: there is none
    assert plan is not None and list(plan.finished_seq_ids) == [request.seq_id]
    error = harness.errors[request.request_id]
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "grew to 9 tokens" in error.message and "holds 8" in error.message
    assert request.finish_reason is FinishReason.ABORT and not harness.finished(request.request_id)
    assert harness.scheduler.stats.num_preemptions == 0
    assert harness.block_manager.num_used_blocks == 0
    assert harness.step() is None


def test_a_victim_too_long_to_ever_resume_fails_when_it_would_be_readmitted():
    # `low` fills the 3-block pool with 12 tokens of KV and has a 13th token
    # to decode; a better-priority request preempts it. Resuming would take
    # 4 blocks, so it fails with RESOURCE_EXHAUSTED rather than wait forever.
    harness = Harness(num_blocks=3)
    low = harness.add(make_request(prompt=unique_prompt(8), max_tokens=20, priority=1))
    for _ in range(5):
        harness.step()
    assert low.num_tokens == 13 and harness.block_manager.num_free_blocks == 0
    high = harness.add(make_request(prompt=unique_prompt(4), max_tokens=2, priority=0))
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [low.seq_id]
    assert [seq.seq_id for seq in plan.new_sequences] == [high.seq_id]
    harness.run()
    assert harness.errors[low.request_id].code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert harness.final(high.request_id).completion_tokens == 2
    assert harness.block_manager.num_used_blocks == 0
