"""Plans that contradict the worker's state are rejected whole, before anything changes."""

from __future__ import annotations

import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.errors import PlanError

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def new_seq(seq_id=1, tokens=(1, 2, 3), scheduled=3, blocks=(0,), **kwargs):
    return pb.NewSequence(
        seq_id=seq_id,
        prompt_token_ids=list(tokens),
        num_scheduled_tokens=scheduled,
        block_ids=list(blocks),
        sampling=kwargs.pop("sampling", GREEDY),
        **kwargs,
    )


def runner_holding_one_sequence(make_runner):
    """Sequence 1: 3 prompt tokens computed, 1 sampled, in block 0 of an 8-block pool."""
    r = make_runner(num_blocks=8)
    r.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(seq_id=1)]))
    return r


@pytest.fixture(scope="module")
def shared_runner(make_runner):
    # Shared by the rejection cases: a rejected plan changes nothing (tested below).
    return runner_holding_one_sequence(make_runner)


@pytest.fixture
def runner(make_runner):
    return runner_holding_one_sequence(make_runner)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (
            pb.StepPlan(continuing_sequences=[pb.ContinuingSequence(seq_id=99)]),
            "unknown sequence 99",
        ),
        (pb.StepPlan(new_sequences=[new_seq(seq_id=2, blocks=(8,))]), "out of range"),
        (
            pb.StepPlan(
                continuing_sequences=[
                    pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1, new_block_ids=[3, 12])
                ]
            ),
            "out of range",
        ),
        (
            pb.StepPlan(new_sequences=[new_seq(seq_id=2, tokens=range(20), scheduled=20)]),
            "cannot hold",
        ),
        (pb.StepPlan(new_sequences=[new_seq(seq_id=2, scheduled=4)]), "has only 3 tokens"),
        (
            pb.StepPlan(
                continuing_sequences=[pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=2)]
            ),
            "has only 4 tokens",
        ),
        (pb.StepPlan(new_sequences=[new_seq(seq_id=1)]), "already held"),
        (
            pb.StepPlan(
                new_sequences=[new_seq(seq_id=2, blocks=(1,)), new_seq(seq_id=2, blocks=(2,))]
            ),
            "listed twice",
        ),
        (
            pb.StepPlan(new_sequences=[new_seq(seq_id=2, tokens=(1, 10**6))]),
            "outside the vocabulary",
        ),
        (
            pb.StepPlan(new_sequences=[new_seq(seq_id=2, tokens=(), scheduled=0)]),
            "no prompt tokens",
        ),
        (
            pb.StepPlan(new_sequences=[new_seq(seq_id=2, sampling=pb.SequenceSampling())]),
            "top_p",
        ),
        (
            pb.StepPlan(
                finished_seq_ids=[1],
                continuing_sequences=[pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1)],
            ),
            "unknown sequence 1",
        ),
    ],
)
def test_bad_plans_are_rejected(shared_runner, plan, message):
    with pytest.raises(PlanError, match=message):
        shared_runner.execute(plan)


def test_rejected_plan_changes_nothing(runner):
    before = runner.sequences[1]
    snapshot = (list(before.token_ids), before.num_computed_tokens, list(before.block_ids))
    plan = pb.StepPlan(
        finished_seq_ids=[1],
        new_sequences=[new_seq(seq_id=5, blocks=(2,))],
        continuing_sequences=[pb.ContinuingSequence(seq_id=77)],
    )
    with pytest.raises(PlanError):
        runner.execute(plan)
    assert set(runner.sequences) == {1}
    after = runner.sequences[1]
    assert (after.token_ids, after.num_computed_tokens, after.block_ids) == snapshot


def test_decode_after_prefill_and_finish(runner):
    seq = runner.sequences[1]
    assert seq.num_tokens == 4 and seq.num_computed_tokens == 3
    result = runner.execute(
        pb.StepPlan(
            step_id=2,
            continuing_sequences=[pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1)],
        )
    )
    assert list(result.seq_ids) == [1] and result.num_tokens == 1 and result.forward_seconds > 0
    runner.execute(pb.StepPlan(step_id=3, finished_seq_ids=[1, 12345]))
    assert runner.sequences == {}
