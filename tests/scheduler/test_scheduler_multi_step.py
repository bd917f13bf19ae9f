"""Multi-step decoding (--num-scheduler-steps): one plan, several decode steps.

Against the protocol-checking fake worker, which runs a plan of n steps as n
forwards (each computing the token the one before sampled): the client sees
exactly the tokens a plan per token would give, nothing after a stop, and
the books hold after every step.
"""

from __future__ import annotations

from scheduler_svc.core.request import FinishReason

from .books import check_books
from .harness import EOS, Harness, encode, make_request, unique_prompt

THE, CAT, S, TOP = (encode(text)[0] for text in (" the", " cat", " S", "TOP"))


def run_checked(harness: Harness, max_steps: int = 200) -> list:
    """Steps until idle, checking the books after each; returns the plans with work."""
    plans = []
    for _ in range(max_steps):
        plan = harness.step()
        check_books(harness.scheduler)
        if plan is None:
            return plans
        if plan.new_sequences or plan.continuing_sequences:
            plans.append(plan)
    raise AssertionError(f"not idle after {max_steps} steps")


def assert_all_released(harness: Harness) -> None:
    assert not harness.scheduler.has_unfinished_requests()
    assert harness.block_manager.num_free_blocks == harness.block_manager.num_blocks
    assert harness.worker.sequences == {}


def test_decodes_are_planned_k_steps_at_once_and_max_tokens_holds_exactly():
    harness = Harness(num_scheduler_steps=4)
    request = harness.add(make_request(8, max_tokens=10, ignore_eos=True))
    plans = run_checked(harness)
    # The prefill samples the first token; 9 are left: 4 + 4, then 1 (never 4 past the limit).
    assert [plan.num_steps for plan in plans] == [1, 4, 4, 1]
    assert [plan.num_scheduled_tokens for plan in plans] == [8, 4, 4, 1]
    final = harness.final(request.request_id)
    assert final.finish_reason is FinishReason.LENGTH
    assert harness.token_ids(request.request_id) == [THE] * 10
    assert final.completion_tokens == 10
    # One output per request and plan: the four tokens of a plan come as one delta.
    deltas = harness.outputs[request.request_id]
    assert [len(output.new_token_ids) for output in deltas] == [1, 4, 4, 1]
    assert_all_released(harness)


def test_tokens_after_a_stop_never_reach_the_client():
    harness = Harness(num_scheduler_steps=4)
    stopping = harness.add(make_request(8, max_tokens=20), tokens=[CAT, CAT, EOS, CAT, CAT, CAT])
    going_on = harness.add(make_request(9, max_tokens=7, ignore_eos=True), tokens=[CAT] * 7)
    plans = run_checked(harness)
    assert plans[1].num_steps == 4
    # The EOS was the third token: the two sampled after it in the same plan are dropped.
    assert harness.token_ids(stopping.request_id) == [CAT, CAT, EOS]
    assert harness.final(stopping.request_id).finish_reason is FinishReason.STOP
    assert harness.final(stopping.request_id).completion_tokens == 3
    assert stopping.output_token_ids == [CAT, CAT, EOS]
    # The worker was told to drop it at the next plan; the other one went on alone.
    assert stopping.seq_id in plans[2].finished_seq_ids
    assert [s.seq_id for s in plans[2].continuing_sequences] == [going_on.seq_id]
    assert harness.token_ids(going_on.request_id) == [CAT] * 7
    assert harness.final(going_on.request_id).finish_reason is FinishReason.LENGTH
    assert_all_released(harness)


def test_a_stop_string_inside_a_plan_cuts_the_text_and_drops_the_rest():
    harness = Harness(num_scheduler_steps=4)
    request = harness.add(
        make_request(8, max_tokens=20, stop=("STOP",)), tokens=[THE, CAT, S, TOP, THE, THE]
    )
    plans = run_checked(harness)
    assert plans[1].num_steps == 4  # samples CAT, S, TOP, THE: TOP completes the stop string
    assert harness.token_ids(request.request_id) == [THE, CAT, S, TOP]
    assert harness.text(request.request_id) == " the cat "
    assert harness.final(request.request_id).finish_reason is FinishReason.STOP
    assert_all_released(harness)


def test_each_token_of_a_plan_has_its_logprobs():
    harness = Harness(num_scheduler_steps=4)
    request = harness.add(
        make_request(8, max_tokens=6, ignore_eos=True, logprobs=2),
        tokens=[THE, CAT, S, TOP, THE, CAT],
    )
    run_checked(harness)
    for output in harness.outputs[request.request_id]:
        assert [entry.token_id for entry in output.logprobs] == output.new_token_ids
        # The fake worker's top tokens: the sampled one, then the next id.
        assert [entry.top[0][0] for entry in output.logprobs] == output.new_token_ids
    assert harness.token_ids(request.request_id) == [THE, CAT, S, TOP, THE, CAT]


def test_a_request_arriving_meanwhile_gets_a_one_step_plan_then_multi_step_resumes():
    harness = Harness(num_scheduler_steps=4)
    first = harness.add(make_request(8, max_tokens=30, ignore_eos=True))
    assert harness.step().num_steps == 1  # the prefill
    assert harness.step().num_steps == 4
    second = harness.add(make_request(unique_prompt(5), max_tokens=30, ignore_eos=True))
    admitting = harness.step()
    assert [s.seq_id for s in admitting.new_sequences] == [second.seq_id]
    assert admitting.num_steps == 1  # a prefill beside the decode: one step
    decoding = harness.step()
    assert decoding.num_steps == 4
    assert {s.seq_id for s in decoding.continuing_sequences} == {first.seq_id, second.seq_id}
    run_checked(harness)
    assert harness.token_ids(first.request_id) == harness.token_ids(second.request_id)
    assert len(harness.token_ids(first.request_id)) == 30
    assert_all_released(harness)


def test_a_prefill_chunk_left_for_later_keeps_plans_to_one_step():
    # A budget of 3 tokens: the long prompt is prefilled 2 tokens a step beside a decode,
    # its last chunk too (a last chunk of one token would be a decode like any other).
    harness = Harness(num_scheduler_steps=4, max_num_batched_tokens=3)
    harness.add(make_request(2, max_tokens=20, ignore_eos=True))
    harness.step()
    long = harness.add(make_request(unique_prompt(10), max_tokens=5, ignore_eos=True))
    steps = []
    while long.is_prefilling or not long.output_token_ids:
        steps.append(harness.step().num_steps)
        check_books(harness.scheduler)
    assert steps and set(steps) == {1}
    run_checked(harness)
    assert_all_released(harness)


def test_the_lookahead_takes_free_blocks_only_and_never_preempts():
    # Two 4-token prompts in a 4-block pool of 4-token blocks: after the prefill each
    # holds 2 blocks for its decode and none is free, so 8 steps (12 tokens of KV
    # each) do not fit; 4 steps fill their second blocks exactly.
    harness = Harness(num_scheduler_steps=8, num_blocks=4, block_size=4)
    requests = [
        harness.add(make_request(unique_prompt(4), max_tokens=8, ignore_eos=True), tokens=[THE] * 8)
        for _ in range(2)
    ]
    plans = run_checked(harness)
    assert plans[1].num_steps == 4
    assert not plans[1].finished_seq_ids
    # Then the pool is too small for both: one is preempted (by the one-token rules),
    # recomputed later, and the client still sees each token exactly once.
    assert harness.scheduler.stats.num_preemptions >= 1
    assert any(plan.num_steps > 1 for plan in plans[2:])
    for request in requests:
        assert harness.token_ids(request.request_id) == [THE] * 8
        assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    assert_all_released(harness)


def test_an_abort_while_a_multi_step_plan_is_in_flight_drops_all_its_tokens():
    harness = Harness(num_scheduler_steps=4)
    request = harness.add(make_request(8, max_tokens=20, ignore_eos=True))
    harness.step()
    plan = harness.schedule()
    assert plan.num_steps == 4
    harness.scheduler.abort_request(request.request_id)
    outputs = harness.scheduler.update_from_output(plan, harness.worker.step(plan))
    assert outputs == []
    assert len(harness.token_ids(request.request_id)) == 1
    check_books(harness.scheduler)
    assert request.seq_id in harness.step().finished_seq_ids
    assert_all_released(harness)
