"""The allowed-token mask on the worker: read from the plan, applied by the sampler
before everything else, honoured by the null runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.sampling_params import SamplingParams
from worker_svc.errors import PlanError
from worker_svc.sampler import PenaltyCounts, Sampler
from worker_svc.token_bitmask import allowed_ids, apply_allowed_tokens

from .test_null_runner import make_runner, new_seq

VOCAB = 100


def mask_row(ids, vocab=VOCAB) -> np.ndarray:
    bits = np.zeros(((vocab + 31) // 32) * 32, dtype=np.uint8)
    bits[list(ids)] = 1
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


class Row:
    def __init__(self, **sampling) -> None:
        self.sampling = SamplingParams(**sampling)
        self.num_output_tokens = 0
        self.penalties = PenaltyCounts(VOCAB, [7], [7, 7]) if self.sampling.uses_penalties else None


def test_rows_round_trip_and_ids_past_the_mask_are_banned():
    row = mask_row([0, 31, 32, 63, 99])
    assert list(allowed_ids(row)) == [0, 31, 32, 63, 99]
    logits = torch.zeros(2, VOCAB + 20)  # a model vocabulary padded past the tokenizer's
    apply_allowed_tokens(logits, [None, row])
    assert torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [0, 31, 32, 63, 99]


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0},
        {"temperature": 1.0, "seed": 3},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
        {"temperature": 0.0, "repetition_penalty": 1.5, "frequency_penalty": -2.0},
    ],
)
def test_the_sampler_picks_only_allowed_tokens_whatever_else_is_set(sampling):
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 5
    logits[:, 7] = 100.0  # the favourite of every row, banned by the mask of row 1
    allowed = [None, mask_row([3, 50, 60]), None]
    rows = [Row(**sampling) for _ in range(3)]
    sampler = Sampler(seed=0)
    for _ in range(20):
        out = sampler.sample(logits, rows, allowed)
        assert out.token_ids[1] in (3, 50, 60)
        if sampling.get("temperature") == 0.0 and "repetition_penalty" not in sampling:
            assert out.token_ids[0] == out.token_ids[2] == 7  # free rows are untouched


def test_logprobs_of_a_constrained_row_come_from_the_masked_logits():
    """As in vLLM: the mask applies before the logprobs (penalties and temperature
    after them), so a constrained row's logprobs are over its allowed tokens; a free
    row's stay those of the raw logits, and the caller's logits are left as they were."""
    torch.manual_seed(1)
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    allowed_now = [3, 50, 60]
    rows = [Row(temperature=0.0, logprobs=5, repetition_penalty=1.3) for _ in range(2)]
    out = Sampler(seed=0).sample(logits, rows, [mask_row(allowed_now), None])
    assert torch.equal(logits, before)
    masked = torch.full((VOCAB,), float("-inf"))
    masked[allowed_now] = logits[0, allowed_now]
    expected = masked.log_softmax(-1)
    constrained = out.logprobs[0]
    assert constrained.logprob == pytest.approx(expected[out.token_ids[0]].item(), abs=1e-6)
    assert sorted(constrained.top_token_ids[:3]) == allowed_now
    assert all(value == float("-inf") for value in constrained.top_logprobs[3:])
    free = out.logprobs[1]
    raw = logits[1].log_softmax(-1)
    assert free.logprob == pytest.approx(raw[out.token_ids[1]].item(), abs=1e-6)


def plan_with_mask(seq_ids, rows, num_steps=1, sequences=(1,)) -> pb.StepPlan:
    words = b"".join(r.astype("<i4").tobytes() for r in rows)
    return pb.StepPlan(
        step_id=1,
        new_sequences=[new_seq(s, 3, [s]) for s in sequences],
        num_steps=num_steps,
        allowed_tokens=pb.TokenBitmask(seq_ids=seq_ids, words=words),
    )


def read_masks(plan: pb.StepPlan, runner=None) -> dict:
    """The masks as the runner's reader reads them from the plan (step/reader.py)."""
    runner = runner or make_runner()
    return dict(runner.reader.read(plan, runner.sequences).allowed_tokens)


def test_malformed_masks_refuse_the_plan():
    row = mask_row([1])
    with pytest.raises(PlanError, match="not in the plan"):
        read_masks(plan_with_mask([9], [row]))
    with pytest.raises(PlanError, match="rows of words"):
        read_masks(plan_with_mask([1, 2], [row[:-1], row], sequences=(1, 2)))
    with pytest.raises(PlanError, match="but no seq_ids"):
        read_masks(plan_with_mask([], [row]))
    runner = make_runner()
    runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [1, 2])]))
    two_steps = pb.StepPlan(step_id=2, num_steps=2, decode_seq_ids=[1])
    two_steps.allowed_tokens.CopyFrom(plan_with_mask([1], [row]).allowed_tokens)
    with pytest.raises(PlanError, match="one step only"):
        read_masks(two_steps, runner)
    assert set(read_masks(plan_with_mask([1], [row]))) == {1}


def test_a_mask_for_a_plain_decode_in_the_packed_list_is_read():
    # Plain decodes travel as ids in decode_seq_ids, not as ContinuingSequence messages.
    runner = make_runner()
    runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(5, 3, [5])]))
    plan = plan_with_mask([1, 5], [mask_row([1]), mask_row([2])])
    plan.decode_seq_ids.append(5)
    assert [int(r[0]) for r in read_masks(plan, runner).values()] == [2, 4]


def test_the_null_runner_samples_within_the_mask():
    runner = make_runner()  # its vocabulary is ids 100..139; the mask allows 5 and 7 only
    rows = [mask_row([5, 7], vocab=200), mask_row(range(150, 160), vocab=200)]
    result = runner.execute(plan_with_mask([1, 2], rows, sequences=(1, 2, 3)))
    tokens = dict(zip(result.seq_ids, result.token_ids, strict=True))
    assert tokens[1] in (5, 7) and 150 <= tokens[2] < 160 and 100 <= tokens[3] < 140
