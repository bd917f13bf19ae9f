"""Verifying a sequence's drafts in the step that computes them, exactly.

A speculating sequence computes 1 + j tokens in one step: the token it sampled last
and its j drafts, each as a decode row of its own over the same block table (row i at
position p + i attends to the KV of rows 0..i, written in the same layer before any
row attends). Row i's logits give the distribution of the token after draft i - 1.

Acceptance is exact for every sampling setting, not only greedy: each row is sampled
by the ordinary sampler as if the drafts before it had been the sequence's outputs
(its output index, hence a seeded row's noise, and its penalty counts include them),
and drafts are accepted while the row's sampled token equals the draft. The first
row whose token differs gives the correction, and a row after every accepted draft
gives one more token. Each emitted token was drawn from the target distribution given
the tokens before it, so the output is distributed as without speculation; a greedy
or seeded row emits the very tokens it would emit without it (vLLM's and llama.cpp's
acceptance for greedy; for sampled rows this is the draft-model-free special case of
rejection sampling, where the draft distribution is a point mass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.sampling_params import SamplingParams
from worker_svc.sampler import PenaltyCounts
from worker_svc.sequence import SequenceState


@dataclass(frozen=True, slots=True)
class DraftPositionRow:
    """What the sampler reads for the row after `drafts[:i]` of a sequence."""

    seq_id: int
    sampling: SamplingParams
    num_output_tokens: int
    penalties: PenaltyCounts | None


def verification_rows(seq: SequenceState, drafts: Sequence[int]) -> list:
    """The sampler's 1 + len(drafts) rows of a speculating sequence: the sequence itself,
    then one per draft, each seeing the drafts before it as outputs."""
    rows: list = [seq]
    counts = seq.penalties
    for i, draft in enumerate(drafts):
        if counts is not None:
            counts = _with_token(counts, draft)
        rows.append(
            DraftPositionRow(seq.seq_id, seq.sampling, seq.num_output_tokens + i + 1, counts)
        )
    return rows


def emitted_tokens(sampled: Sequence[int], drafts: Sequence[int]) -> int:
    """How many of a sequence's 1 + len(drafts) sampled tokens it emits: every row while
    the drafts agree, and the first row that disagrees."""
    for i, draft in enumerate(drafts):
        if sampled[i] != draft:
            return i + 1
    return len(drafts) + 1


def _with_token(counts: PenaltyCounts, token_id: int) -> PenaltyCounts:
    copy = PenaltyCounts.__new__(PenaltyCounts)
    copy.prompt_mask = counts.prompt_mask
    copy.output_counts = counts.output_counts.clone()
    copy.append(token_id)
    return copy
