"""What schedule() puts in a plan: admission, chunked prefill, mixed steps, limits.

In the style of vLLM's tests/v1/core/test_scheduler.py: the real scheduler with
a small pool, a plan, a (fake) worker result into update_from_output, then
assertions on queues, computed counts, block tables and the plan itself.
"""

from __future__ import annotations

import pytest

from scheduler_svc.core.plan import StepOutput, StepPlan
from scheduler_svc.core.request import RequestStatus

from .harness import EOS, Harness, make_request, unique_prompt


def _scheduled(plan: StepPlan) -> dict[int, int]:
    sequences = [*plan.new_sequences, *plan.continuing_sequences]
    return {seq.seq_id: seq.num_scheduled_tokens for seq in sequences}


def test_schedule_returns_none_when_idle(harness):
    assert harness.scheduler.schedule() is None
    assert not harness.scheduler.has_unfinished_requests()


def test_new_requests_are_all_admitted_in_one_step(harness):
    requests = [harness.add(make_request(prompt=5, max_tokens=3, seed=7)) for _ in range(3)]
    assert harness.scheduler.num_waiting == 3
    plan = harness.step()
    assert plan.step_id == 1
    assert harness.scheduler.num_running == 3 and harness.scheduler.num_waiting == 0
    assert [seq.seq_id for seq in plan.new_sequences] == [r.seq_id for r in requests]
    for request, seq in zip(requests, plan.new_sequences, strict=True):
        assert list(seq.prompt_token_ids) == request.prompt_token_ids
        assert seq.num_computed_tokens == 0
        assert seq.num_scheduled_tokens == 5
        assert list(seq.block_ids) == list(harness.block_manager.block_table(request.seq_id))
        assert len(seq.block_ids) == 2  # 5 tokens in blocks of 4
        assert seq.sampling == request.sampling
        assert seq.sampling.min_tokens_banned_ids == ()
        assert request.status is RequestStatus.RUNNING
        assert request.num_computed_tokens == 5
        assert request.num_output_tokens == 1


@pytest.mark.parametrize(
    ("sampling", "banned"),
    [
        ({"min_tokens": 2, "stop_token_ids": (9, 7)}, (EOS, 7, 9)),
        ({"min_tokens": 2, "stop_token_ids": (7,), "ignore_eos": True}, (7,)),
        ({"stop_token_ids": (7,)}, ()),
    ],
)
def test_a_new_sequence_carries_the_ids_banned_until_min_tokens(harness, sampling, banned):
    # Worked out once, when the scheduler takes the request in (it knows the EOS).
    request = harness.add(make_request(prompt=5, max_tokens=4, **sampling))
    (seq,) = harness.step().new_sequences
    assert seq.sampling.min_tokens_banned_ids == banned
    assert seq.sampling is request.sampling


def test_continuing_sequences_carry_only_counts_and_new_blocks(harness):
    request = harness.add(make_request(prompt=7, max_tokens=5))
    harness.step()  # prefill 7 tokens in 2 blocks, samples token 8
    plan = harness.step()  # decode token 8: still fits block 2
    assert plan.step_id == 2 and not plan.new_sequences
    [seq] = plan.continuing_sequences
    assert (seq.seq_id, seq.num_scheduled_tokens, list(seq.new_block_ids)) == (
        request.seq_id,
        1,
        [],
    )
    plan = harness.step()  # decode token 9: needs a third block
    [seq] = plan.continuing_sequences
    assert len(seq.new_block_ids) == 1
    assert harness.block_manager.block_table(request.seq_id)[-1] == seq.new_block_ids[0]


def test_budget_splits_a_long_prompt_over_several_steps():
    harness = Harness(max_num_batched_tokens=16, max_num_seqs=4)
    request = harness.add(make_request(prompt=40, max_tokens=2))
    chunks = []
    for _ in range(3):
        plan = harness.step()
        chunks.append(_scheduled(plan)[request.seq_id])
        # Admission gave blocks for the whole prompt at once, so that a request
        # in the middle of its prefill never needs a block (nor a preemption).
        assert len(harness.block_manager.block_table(request.seq_id)) == 10
        assert all(not seq.new_block_ids for seq in plan.continuing_sequences)
    assert chunks == [16, 16, 8]
    assert len(plan.new_sequences) == 0
    # No token and no output until the last chunk.
    assert request.num_output_tokens == 1
    assert len(harness.outputs[request.request_id]) == 1


def test_decodes_keep_flowing_beside_a_chunked_prefill():
    harness = Harness(max_num_batched_tokens=16, max_num_seqs=4)
    decoder = harness.add(make_request(prompt=unique_prompt(4), max_tokens=20))
    harness.step()
    long = harness.add(make_request(prompt=unique_prompt(50), max_tokens=2))
    for _ in range(3):
        plan = harness.step()
        # One step mixes a decode and a prefill chunk that takes the rest of the budget.
        assert _scheduled(plan) == {decoder.seq_id: 1, long.seq_id: 15}
    plan = harness.step()
    assert _scheduled(plan) == {decoder.seq_id: 1, long.seq_id: 5}
    # The decoder got a token in every step.
    assert len(harness.outputs[decoder.request_id]) == 5
    assert long.num_output_tokens == 1


def test_waiting_requests_are_admitted_in_arrival_order_inside_the_budget():
    harness = Harness(max_num_batched_tokens=10, max_num_seqs=4)
    first, second, third = (
        harness.add(make_request(prompt=unique_prompt(6), max_tokens=4)) for _ in range(3)
    )
    plan = harness.step()
    # The second is admitted with the 4 tokens left; the third must wait.
    assert _scheduled(plan) == {first.seq_id: 6, second.seq_id: 4}
    assert third.status is RequestStatus.WAITING
    plan = harness.step()
    assert _scheduled(plan) == {first.seq_id: 1, second.seq_id: 2, third.seq_id: 6}


def test_max_num_seqs_caps_the_running_requests():
    harness = Harness(max_num_seqs=2, max_num_batched_tokens=64)
    first = harness.add(make_request(prompt=4, max_tokens=2))
    second = harness.add(make_request(prompt=4, max_tokens=5))
    third = harness.add(make_request(prompt=4, max_tokens=2))
    plan = harness.step()
    assert set(_scheduled(plan)) == {first.seq_id, second.seq_id}
    assert harness.scheduler.num_running == 2 and harness.scheduler.num_waiting == 1
    harness.step()  # first finishes on its second token
    assert harness.final(first.request_id).finish_reason is not None
    plan = harness.step()
    assert set(_scheduled(plan)) == {second.seq_id, third.seq_id}
    assert list(plan.finished_seq_ids) == [first.seq_id]


def test_a_budget_smaller_than_max_num_seqs_caps_the_running_requests_too():
    # Otherwise a third running request could never get its decode token.
    harness = Harness(max_num_seqs=4, max_num_batched_tokens=2)
    requests = [harness.add(make_request(prompt=1, max_tokens=5)) for _ in range(3)]
    for _ in range(4):
        plan = harness.step()
        assert set(_scheduled(plan)) == {requests[0].seq_id, requests[1].seq_id}
    assert requests[2].status is RequestStatus.WAITING
    harness.run()
    assert all(harness.final(r.request_id).completion_tokens == 5 for r in requests)


def test_a_request_that_does_not_fit_waits_until_blocks_come_back_then_runs():
    # 8 blocks of 4 tokens: `first` takes 6 of them for its prompt, `second`
    # needs 3 for its own, so it waits (a request of the same priority is
    # never preempted to admit another) until `first` finishes.
    harness = Harness(num_blocks=8, block_size=4)
    first = harness.add(make_request(prompt=24, max_tokens=6))
    second = harness.add(make_request(prompt=list(range(500, 510)), max_tokens=8))
    harness.step()
    assert harness.block_manager.num_free_blocks == 2
    assert second.status is RequestStatus.WAITING
    steps = 1
    while first.status is RequestStatus.RUNNING:
        plan = harness.step()
        steps += 1
        assert second.seq_id not in _scheduled(plan)
    assert steps == 6 and first.num_preemptions == 0
    plan = harness.step()
    assert second.seq_id in _scheduled(plan)
    harness.run()
    assert harness.final(second.request_id).completion_tokens == 8
    assert harness.block_manager.num_used_blocks == 0
    assert harness.scheduler.stats.num_preemptions == 0


def test_step_ids_increase_and_a_plan_must_be_answered_before_the_next():
    harness = Harness()
    harness.add(make_request(prompt=4, max_tokens=3))
    first = harness.scheduler.schedule()
    with pytest.raises(RuntimeError, match="in flight: call update_from_output first"):
        harness.scheduler.schedule()
    harness.deliver(harness.scheduler.update_from_output(first, harness.worker.step(first)))
    assert harness.step().step_id == first.step_id + 1


def _planned_step() -> tuple[Harness, StepPlan]:
    harness = Harness()
    harness.add(make_request(prompt=4, max_tokens=3))
    return harness, harness.scheduler.schedule()


def test_results_that_break_the_protocol_are_refused():
    harness, plan = _planned_step()
    with pytest.raises(RuntimeError, match="do not match"):
        harness.scheduler.update_from_output(plan, StepOutput(step_id=plan.step_id + 1))
    harness, plan = _planned_step()
    # The prompt's last token was scheduled, so the sequence must sample.
    with pytest.raises(RuntimeError, match="must sample exactly when"):
        harness.scheduler.update_from_output(plan, StepOutput(step_id=plan.step_id))
    harness, plan = _planned_step()
    result = StepOutput(step_id=plan.step_id, seq_ids=[10**9], token_ids=[5])
    with pytest.raises(RuntimeError, match="unscheduled"):
        harness.scheduler.update_from_output(plan, result)


def test_add_request_refuses_what_could_never_run(harness):
    harness.add(make_request(prompt=4, request_id="dup"))
    with pytest.raises(ValueError, match="already scheduled"):
        harness.add(make_request(prompt=4, request_id="dup"))
    with pytest.raises(ValueError, match="prompt must have"):
        harness.add(make_request(prompt=[]))
    with pytest.raises(ValueError, match="prompt must have"):
        harness.add(make_request(prompt=256))
    # Only the prompt is checked here: a prompt that fills the whole pool is
    # accepted, whatever max_tokens says (the gRPC layer refuses prompt +
    # max_tokens over the pool; a request that grows too long fails later
    # with RESOURCE_EXHAUSTED, see test_scheduler_preemption).
    small = Harness(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="needs 3 KV blocks, the pool has 2"):
        small.add(make_request(prompt=9, max_tokens=1))
    request = small.add(make_request(prompt=8, max_tokens=100))
    assert request.status is RequestStatus.WAITING and small.scheduler.num_waiting == 1


def test_a_finished_id_can_be_reused(harness):
    harness.add(make_request(prompt=4, max_tokens=1, request_id="again"))
    harness.run()
    harness.outputs.clear()
    harness.add(make_request(prompt=4, max_tokens=1, request_id="again"))
    harness.run()
    assert harness.final("again").completion_tokens == 1
