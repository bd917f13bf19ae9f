"""Constrained rows that verify drafts, on the real model: each position samples with
the row the scheduler built after the drafts before it (worker.proto's row_counts),
and the worker emits only positions whose row followed its own drafts. In the plan,
drafts past the rows are dropped before the forward; in a deferred message (after the
forward), the tokens past them are."""

from __future__ import annotations

import numpy as np
import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from common.ngram import NgramIndex

from .test_speculative_step import BLOCK_SIZE, LOOKUP, PROMPTS, SAMPLINGS

pytestmark = pytest.mark.model

STREAM = 1
ROOM = 4


def prefilled(make_runner, tokenizer):
    """A runner holding one greedy sequence whose prompt repeats itself, and the drafts
    it will propose next (the lookup the scheduler runs too)."""
    runner = make_runner(num_blocks=24, block_size=BLOCK_SIZE)
    runner.mailbox.reset(STREAM)
    ids = tokenizer(PROMPTS[2])["input_ids"]
    runner.execute(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=ids,
                    num_scheduled_tokens=len(ids),
                    block_ids=[0, 1, 2],
                    sampling=SAMPLINGS[0],
                )
            ],
        )
    )
    drafts = NgramIndex(LOOKUP.min_n, LOOKUP.max_n).propose(runner.sequences[1].token_ids, ROOM)
    assert len(drafts) == ROOM  # "six seven eight nine" follows "five" earlier
    return runner, drafts


def rows(vocab: int, forbid: dict[int, int] | None = None, count: int = ROOM + 1) -> np.ndarray:
    """`count` rows allowing every token but forbid[row] (a token id) where given."""
    words = np.full((count, -(-vocab // 32)), 0xFFFFFFFF, dtype=np.uint32)
    for row, token in (forbid or {}).items():
        words[row, token >> 5] &= ~np.uint32(1 << (token & 31))
    return words.view(np.int32)


def mask(rows_: np.ndarray, drafts) -> pb.TokenBitmask:
    return pb.TokenBitmask(
        seq_ids=[1],
        words=rows_.astype("<i4").tobytes(),
        row_counts=[len(rows_)],
        draft_token_ids=list(drafts[: len(rows_) - 1]),
    )


def decode(runner, step_id: int, masks: pb.TokenBitmask | None, deferred: bool):
    plan = pb.StepPlan(
        step_id=step_id,
        ngram_lookup=LOOKUP,
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1, num_draft_tokens=ROOM)
        ],
    )
    if masks is not None and deferred:
        plan.deferred_mask_seq_ids.append(1)
        plan.deferred_mask_timeout_seconds = 0.2
        message = pb.StepPlan(step_id=step_id, deferred_allowed_tokens=masks)
        runner.mailbox.post(STREAM, message)
    elif masks is not None:
        plan.allowed_tokens.CopyFrom(masks)
    seq = runner.sequences[1]
    before = seq.num_tokens
    result = runner.execute(plan)
    (count,), (verified,) = result.token_counts, result.draft_counts
    assert len(result.token_ids) == count and seq.num_tokens == before + count
    assert seq.num_computed_tokens == seq.num_tokens - 1  # only emitted tokens count
    return list(result.token_ids), verified


@pytest.mark.parametrize("deferred", [False, True])
def test_rows_that_allow_the_drafts_emit_what_unmasked_drafts_emit(
    make_runner, tokenizer, deferred
):
    free_runner, drafts = prefilled(make_runner, tokenizer)
    free_tokens, _ = decode(free_runner, 2, None, deferred=False)
    runner, _ = prefilled(make_runner, tokenizer)
    vocab = runner.reader.vocab_size
    tokens, verified = decode(runner, 2, mask(rows(vocab), drafts), deferred)
    assert tokens == free_tokens and verified == ROOM
    assert len(tokens) > 1, "the prompt repeats: greedy should accept some drafts"


@pytest.mark.parametrize("deferred", [False, True])
def test_a_draft_its_row_forbids_is_rejected_and_nothing_past_it_emitted(
    make_runner, tokenizer, deferred
):
    runner, drafts = prefilled(make_runner, tokenizer)
    free_tokens, _ = decode(prefilled(make_runner, tokenizer)[0], 2, None, deferred=False)
    assert free_tokens[:3] == drafts[:3], "greedy should accept the first drafts"
    # The scheduler's rows stop at draft 2, which row 2 forbids.
    forbidding = rows(runner.reader.vocab_size, forbid={2: drafts[2]}, count=3)
    tokens, verified = decode(runner, 2, mask(forbidding, drafts), deferred)
    assert tokens[:2] == drafts[:2] and len(tokens) == 3 and tokens[2] != drafts[2]
    # In the plan the worker dropped the drafts past the rows before the forward.
    assert verified == (2 if not deferred else 3)


@pytest.mark.parametrize("deferred", [False, True])
def test_rows_that_followed_other_drafts_are_not_used_past_the_first_difference(
    make_runner, tokenizer, deferred
):
    runner, drafts = prefilled(make_runner, tokenizer)
    other = [drafts[0], drafts[1] + 1, *drafts[2:]]
    tokens, _ = decode(runner, 2, mask(rows(runner.reader.vocab_size), other), deferred)
    # Rows 0 and 1 followed the worker's own drafts; row 2 followed another draft.
    assert len(tokens) == 2 and tokens == drafts[:2]


def test_a_lost_deferred_message_with_drafts_reports_the_row_missing(make_runner, tokenizer):
    runner, _ = prefilled(make_runner, tokenizer)
    plan = pb.StepPlan(
        step_id=2,
        ngram_lookup=LOOKUP,
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1, num_draft_tokens=ROOM)
        ],
        deferred_mask_seq_ids=[1],
        deferred_mask_timeout_seconds=0.05,
    )
    result = runner.execute(plan)
    assert list(result.mask_missing_seq_ids) == [1]
    assert len(result.token_ids) == result.token_counts[0] >= 1
