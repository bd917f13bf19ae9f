"""A plan is read once into plain values (worker_svc/step/): what the runners consume."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.step.description import ContinuingSequence, NewSequence, Step

from .test_null_runner import make_runner, new_seq


def held_runner():
    """Sequences 1 and 2 hold 4 tokens (3 computed) in blocks 0 and 1 (block size 4)."""
    runner = make_runner()
    runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [0]), new_seq(2, 3, [1])]))
    return runner


def test_a_mixed_plan_becomes_plain_values():
    runner = held_runner()
    scored = new_seq(3, 6, [2, 3])
    scored.prompt_logprobs = 2
    plan = pb.StepPlan(
        step_id=7,
        finished_seq_ids=[9],
        new_sequences=[scored],
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1, new_block_ids=[4])
        ],  # fmt: skip
        decode_seq_ids=[2],
    )
    plan.allowed_tokens.seq_ids.append(2)
    plan.allowed_tokens.words = np.array([5, 0, 0, 0, 0, 0, 0], dtype="<i4").tobytes()
    step = runner.reader.read(plan, runner.sequences)

    assert isinstance(step, Step) and (step.step_id, step.num_steps) == (7, 1)
    assert step.finished_seq_ids == (9,)
    [new] = step.new_sequences
    assert isinstance(new, NewSequence)
    assert (new.seq_id, new.prompt_token_ids, new.block_ids) == (3, tuple(range(10, 16)), (2, 3))
    assert (new.num_computed_tokens, new.num_scheduled_tokens, new.prompt_logprobs) == (0, 6, 2)
    assert new.sampling.temperature == 1.0
    assert step.continuing_sequences == (ContinuingSequence(1, 1, (4,)),)
    # Plain decodes stay packed, as on the wire.
    assert step.decode_seq_ids == (2,)
    assert list(step.allowed_tokens) == [2] and int(step.allowed_tokens[2][0]) == 5
    # Reading changes nothing the runner holds: the blocks come with the run.
    assert runner.sequences[1].block_ids == [0]


def test_the_description_is_frozen_and_takes_new_fields_with_defaults():
    step = Step(step_id=1)
    assert (step.num_steps, step.decode_seq_ids, dict(step.allowed_tokens)) == (1, (), {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.step_id = 2  # type: ignore[misc]
