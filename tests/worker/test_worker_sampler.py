"""The batched sampler: greedy, truncation, seeded determinism, penalties, min_tokens, logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from common.sampling_params import SamplingParams
from worker_svc.sampler import (
    PenaltyCounts,
    Sampler,
    apply_min_tokens,
    apply_penalties,
    row_argmax,
)

VOCAB = 50


@dataclass
class Row:
    sampling: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    penalties: PenaltyCounts | None = None

    def __post_init__(self):
        if self.sampling.uses_penalties:
            self.penalties = PenaltyCounts(VOCAB, self.prompt_token_ids, self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_leaves_logits_untouched():
    logits = random_logits(4)
    before = logits.clone()
    out = Sampler(seed=0).sample(logits, [Row(SamplingParams(temperature=0))] * 4)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert torch.equal(logits, before)
    assert out.logprobs == [None] * 4


def test_top_k_one_is_greedy():
    logits = random_logits(6, seed=1)
    rows = [Row(SamplingParams(temperature=1.3, top_k=1))] * 6
    for seed in range(5):
        assert Sampler(seed=seed).sample(logits, rows).token_ids == logits.argmax(-1).tolist()


def test_top_p_and_min_p_keep_only_the_head():
    logits = torch.full((2, VOCAB), -10.0)
    logits[:, 7] = 5.0
    logits[:, 8] = 4.0  # softmax mass of 7 alone is ~0.73
    rows = [Row(SamplingParams(top_p=0.5)), Row(SamplingParams(min_p=0.5))]
    for seed in range(20):
        assert Sampler(seed=seed).sample(logits, rows).token_ids == [7, 7]


def test_unrestricted_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    out = Sampler(seed=0).sample(logits, [Row(SamplingParams())] * 4000)
    freq = torch.bincount(torch.tensor(out.token_ids), minlength=3) / 4000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03, rtol=0)


def seeded_run(sampler, logits_per_step, others):
    """Sample 12 tokens for a seeded row placed among `others` unseeded random rows."""
    row = Row(SamplingParams(temperature=1.0, seed=1234))
    tokens = []
    for step, logits in enumerate(logits_per_step):
        batch = torch.cat([random_logits(others, seed=100 + step), logits[None]])
        token = sampler.sample(batch, [Row(SamplingParams())] * others + [row]).token_ids[-1]
        row.output_token_ids.append(token)
        tokens.append(token)
    return tokens


def test_seeded_row_is_independent_of_the_batch():
    steps = [random_logits(1, seed=s)[0] / 3 for s in range(12)]
    alone = seeded_run(Sampler(seed=1), steps, others=0)
    crowded = seeded_run(Sampler(seed=2), steps, others=8)
    assert alone == crowded
    # And the tokens really are random draws, not the argmax.
    assert alone != [int(s.argmax()) for s in steps]


def test_seeded_row_resumes_after_recompute():
    logits = random_logits(1, seed=5) / 3
    full = Row(SamplingParams(temperature=0.9, seed=7))
    for _ in range(10):
        full.output_token_ids.append(Sampler().sample(logits, [full]).token_ids[0])
    # A recomputed sequence arrives with its earlier outputs; the 7th draw is the same.
    resumed = Row(
        SamplingParams(temperature=0.9, seed=7), output_token_ids=full.output_token_ids[:6]
    )
    assert Sampler().sample(logits, [resumed]).token_ids[0] == full.output_token_ids[6]


def test_penalties_follow_vllm_semantics():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]]).repeat(3, 1)
    vocab = logits.shape[1]

    def row(**kwargs):
        r = Row(SamplingParams(**kwargs), output_token_ids=[0, 0, 1], prompt_token_ids=[3])
        r.penalties = PenaltyCounts(vocab, r.prompt_token_ids, r.output_token_ids)
        return r

    rows = [row(repetition_penalty=2.0), row(frequency_penalty=0.5), row(presence_penalty=0.25)]
    apply_penalties(logits, rows)
    # Repetition over prompt + output: positive divided, negative multiplied; unseen unchanged.
    assert logits[0].tolist() == [1.0, -4.0, 2.0, -4.0, 1.0]
    # Frequency over outputs only: token 0 seen twice, token 1 once.
    assert logits[1].tolist() == [1.0, -2.5, 2.0, -2.0, 1.0]
    # Presence over outputs only, once per distinct token.
    assert logits[2].tolist() == [1.75, -2.25, 2.0, -2.0, 1.0]


def test_penalty_counts_follow_appended_tokens():
    counts = PenaltyCounts(VOCAB, [1, 2], [3])
    counts.append(3)
    counts.append(4)
    assert counts.output_counts[3] == 2 and counts.output_counts[4] == 1
    assert counts.prompt_mask[[1, 2]].all() and not counts.prompt_mask[3]


def test_min_tokens_masks_banned_ids_until_reached():
    params = SamplingParams(temperature=0, min_tokens=2, min_tokens_banned_ids=(4, 9))
    logits = torch.zeros(2, VOCAB)
    logits[:, 4] = 10.0
    short, long = Row(params, output_token_ids=[1]), Row(params, output_token_ids=[1, 2])
    masked = logits.clone()
    apply_min_tokens(masked, [short, long])
    assert masked[0, 4] == float("-inf") and masked[0, 9] == float("-inf")
    assert torch.equal(masked[1], logits[1])
    assert Sampler().sample(logits, [short, long]).token_ids[1] == 4
    assert Sampler().sample(logits, [short, long]).token_ids[0] != 4


def test_argmax_only_rows_answer_as_the_general_path_does():
    # All plain greedy rows take the argmax of the logits as they are; one row asking
    # for logprobs sends the same batch down the general path: the tokens agree.
    logits = random_logits(8, seed=4)
    logits[2, 5] = logits[2, 11] = logits[2].max() + 1.0  # a tie: the first index
    plain = [Row(SamplingParams(temperature=0)) for _ in range(8)]
    general = [*plain[:7], Row(SamplingParams(temperature=0, logprobs=1))]
    fast = Sampler().sample(logits, plain)
    assert fast.token_ids == Sampler().sample(logits, general).token_ids
    assert fast.token_ids[2] == 5 and fast.logprobs == [None] * 8
    # A min_tokens ban in force is applied alone too; once met, the row is plain again.
    params = SamplingParams(temperature=0, min_tokens=2, min_tokens_banned_ids=(4,))
    banned = torch.zeros(1, VOCAB)
    banned[0, 4] = 10.0
    assert Sampler().sample(banned, [Row(params, output_token_ids=[1])]).token_ids != [4]
    assert Sampler().sample(banned, [Row(params, output_token_ids=[1, 2])]).token_ids == [4]
    # A penalty alone still applies: the penalised token loses its lead.
    penalised = Row(SamplingParams(temperature=0, frequency_penalty=2.0), output_token_ids=[4] * 6)
    assert Sampler().sample(banned, [penalised]).token_ids != [4]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_come_from_raw_logits(temperature):
    logits = random_logits(3, seed=9)
    rows = [
        Row(SamplingParams(temperature=temperature, logprobs=3, repetition_penalty=1.5)),
        Row(SamplingParams(temperature=temperature)),
        Row(SamplingParams(temperature=temperature, logprobs=1)),
    ]
    out = Sampler(seed=0).sample(logits, rows)
    expected = logits.log_softmax(-1)
    assert out.logprobs[1] is None
    for i, k in ((0, 3), (2, 1)):
        entry = out.logprobs[i]
        top = expected[i].topk(k)
        assert entry.top_token_ids == top.indices.tolist()
        assert entry.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-6)
        assert entry.logprob == pytest.approx(float(expected[i, out.token_ids[i]]), abs=1e-6)


def test_invalid_sampling_settings_are_rejected():
    for bad in ({"top_p": 0.0}, {"temperature": -1.0}, {"repetition_penalty": 0.0}, {"top_k": -2}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_row_argmax_is_torchs_argmax_on_ties_nans_and_wide_rows():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(5, 49152, generator=generator)
    values[1, 700] = values[1, 9000] = values[1].max() + 1.0  # a tie: the first index
    values[2, 123] = float("nan")  # a NaN is the largest
    values[3] = float("-inf")  # all -inf: index 0
    values[4, -1] = float("inf")
    expected = values.argmax(-1)
    assert (
        row_argmax(values).tolist()
        == expected.tolist()
        == [
            expected[0].item(),
            700,
            123,
            0,
            49151,
        ]
    )
    assert row_argmax(values[:, ::2]).tolist() == values[:, ::2].argmax(-1).tolist()
