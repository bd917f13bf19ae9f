"""Multi-step plans on the real model: n decode forwards back to back in one execute.

A plan of num_steps n must give each sequence exactly the tokens (and logprobs)
that n one-step plans give, greedy, seeded or with penalties, in the result's
step-major layout; and the worker refuses a multi-step plan that holds anything
but decodes, or whose blocks cannot hold the KV of all its steps.
"""

from __future__ import annotations

import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.errors import PlanError

BLOCK_SIZE = 16
SAMPLINGS = [
    pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0, num_logprobs=3),
    pb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0, seed=7),
    pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.3, presence_penalty=0.5),
]
PROMPTS = [
    "def fibonacci(n):\n    # return the n-th Fibonacci number\n",
    "The river begins in the mountains, where snow melts each spring and",
    "Continuous batching lets a server",
]
STEPS_PER_PLAN = [4, 4, 1, 3]  # 12 decode tokens after the prefill's one


def prefilled(make_runner, tokenizer):
    """A runner holding the three prompts, prefilled, each with blocks for 32 more tokens."""
    runner = make_runner(num_blocks=32, block_size=BLOCK_SIZE)
    plan = pb.StepPlan(step_id=1)
    free = iter(range(32))
    for seq_id, (text, sampling) in enumerate(zip(PROMPTS, SAMPLINGS, strict=True), start=1):
        ids = tokenizer(text)["input_ids"]
        blocks = [next(free) for _ in range(-(-(len(ids) + 32) // BLOCK_SIZE))]
        plan.new_sequences.add(
            seq_id=seq_id,
            prompt_token_ids=ids,
            num_scheduled_tokens=len(ids),
            block_ids=blocks,
            sampling=sampling,
        )
    first = runner.execute(plan)
    tokens = {seq_id: [token] for seq_id, token in zip(first.seq_ids, first.token_ids, strict=True)}
    return runner, tokens


def decode_plan(step_id: int, num_steps: int) -> pb.StepPlan:
    return pb.StepPlan(
        step_id=step_id,
        num_steps=num_steps,
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=seq_id, num_scheduled_tokens=1)
            for seq_id in range(1, len(PROMPTS) + 1)
        ],
    )


def run(runner, tokens, steps_per_plan):
    """Runs decode plans; returns tokens and (token, logprob, top ids) per sequence."""
    logprobs = {seq_id: [] for seq_id in tokens}
    for step_id, num_steps in enumerate(steps_per_plan, start=2):
        result = runner.execute(decode_plan(step_id, num_steps))
        seq_ids = list(result.seq_ids)
        assert sorted(seq_ids) == sorted(tokens), "each sequence listed once"
        assert len(result.token_ids) == num_steps * len(seq_ids)
        assert result.num_tokens == num_steps * len(seq_ids)
        assert result.forward_seconds > 0
        for step in range(num_steps):
            for i, seq_id in enumerate(seq_ids):
                tokens[seq_id].append(result.token_ids[step * len(seq_ids) + i])
        for entry in result.logprobs:
            seq_id = seq_ids[entry.index % len(seq_ids)]
            token = result.token_ids[entry.index]
            logprobs[seq_id].append((token, entry.logprob, list(entry.top_token_ids)))
    return tokens, logprobs


# make test-slow (10 s): make test streams multi-step plans against one-step plans on a
# served stack (test_multi_step.py).
@pytest.mark.slow
def test_a_multi_step_plan_samples_what_one_step_plans_do(make_runner, tokenizer):
    one_step, one_step_logprobs = run(*prefilled(make_runner, tokenizer), [1] * 12)
    multi_step, multi_step_logprobs = run(*prefilled(make_runner, tokenizer), STEPS_PER_PLAN)
    assert multi_step == one_step
    assert all(len(tokens) == 13 for tokens in multi_step.values())
    # Logprobs for every token of the sequence that asked, at the right index.
    assert [entry[0] for entry in multi_step_logprobs[1]] == multi_step[1][1:]
    assert [entry[2][0] for entry in multi_step_logprobs[1]] == multi_step[1][1:]  # greedy
    for (token, logprob, top), (token_1, logprob_1, top_1) in zip(
        multi_step_logprobs[1], one_step_logprobs[1], strict=True
    ):
        assert (token, top) == (token_1, top_1)
        assert logprob == pytest.approx(logprob_1, abs=1e-4)
    assert multi_step_logprobs[2] == multi_step_logprobs[3] == []


def test_the_worker_state_after_a_multi_step_plan(make_runner, tokenizer):
    runner, tokens = prefilled(make_runner, tokenizer)
    before = {seq_id: runner.sequences[seq_id].num_tokens for seq_id in tokens}
    runner.execute(decode_plan(2, 4))
    for seq_id, seq in runner.sequences.items():
        # Four tokens appended; the last one not computed yet (the next decode computes it).
        assert seq.num_tokens == before[seq_id] + 4
        assert seq.num_computed_tokens == seq.num_tokens - 1


def holding_one_sequence(make_runner):
    """Sequence 1: 3 prompt tokens computed, 1 sampled, in block 0 (16 slots) of 8."""
    runner = make_runner(num_blocks=8, block_size=BLOCK_SIZE)
    runner.execute(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=[1, 2, 3],
                    num_scheduled_tokens=3,
                    block_ids=[0],
                    sampling=SAMPLINGS[0],
                )
            ],
        )
    )
    return runner


def decode(num_scheduled=1, new_block_ids=()):
    return pb.ContinuingSequence(
        seq_id=1, num_scheduled_tokens=num_scheduled, new_block_ids=list(new_block_ids)
    )


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (
            pb.StepPlan(
                num_steps=2,
                new_sequences=[
                    pb.NewSequence(
                        seq_id=2,
                        prompt_token_ids=[5],
                        num_scheduled_tokens=1,
                        block_ids=[1],
                        sampling=SAMPLINGS[0],
                    )
                ],
            ),
            "decodes only",
        ),
        # 4 tokens computed after 13 steps: 17 tokens of KV, one block holds 16.
        (pb.StepPlan(num_steps=14, continuing_sequences=[decode()]), "cannot hold 17 tokens"),
    ],
)
def test_bad_multi_step_plans_are_rejected_and_change_nothing(make_runner, plan, message):
    runner = holding_one_sequence(make_runner)
    snapshot = list(runner.sequences[1].token_ids), runner.sequences[1].num_computed_tokens
    with pytest.raises(PlanError, match=message):
        runner.execute(plan)
    assert set(runner.sequences) == {1}
    seq = runner.sequences[1]
    assert (seq.token_ids, seq.num_computed_tokens) == snapshot


def test_a_multi_step_plan_with_a_prefill_chunk_is_rejected(make_runner):
    runner = holding_one_sequence(make_runner)
    # Drop the sequence's KV and send its tokens back as a partial prefill: not a decode.
    runner.execute(pb.StepPlan(step_id=2, finished_seq_ids=[1]))
    runner.execute(
        pb.StepPlan(
            step_id=3,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=[1, 2, 3, 4],
                    num_scheduled_tokens=2,
                    block_ids=[0],
                    sampling=SAMPLINGS[0],
                )
            ],
        )
    )
    with pytest.raises(PlanError, match="must only hold decodes"):
        runner.execute(pb.StepPlan(step_id=4, num_steps=2, continuing_sequences=[decode(2)]))


def test_a_multi_step_plan_fills_the_blocks_it_was_given(make_runner):
    runner = holding_one_sequence(make_runner)
    result = runner.execute(
        pb.StepPlan(step_id=2, num_steps=14, continuing_sequences=[decode(new_block_ids=[3])])
    )
    assert list(result.seq_ids) == [1] and len(result.token_ids) == 14
    assert runner.sequences[1].num_computed_tokens == 17
    assert runner.sequences[1].block_ids == [0, 3]
