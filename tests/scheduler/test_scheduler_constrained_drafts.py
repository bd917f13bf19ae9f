"""Drafts of constrained rows: the scheduler masks each draft position after the drafts
before it (structured/draft_masks.py), against the FakeWorker, which proposes its drafts
with the worker's own n-gram lookup and samples each position with its row.

The mask rows must be those of the request's grammar after exactly its output and the
drafts the worker verifies; a draft the grammar forbids is never emitted; the reply is
the one plain decodes give, in the plan (one plan at a time) and in the deferred
message (async scheduling) alike; a lost message with drafts fails that request only.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from scheduler_svc.core.request import FinishReason
from scheduler_svc.structured.bitmask import allowed_ids
from scheduler_svc.structured.compiler import GrammarCompiler

from .books import check_books
from .fake_drafting import ngram_drafter
from .harness import EOS, Harness, encode, load_tokenizer, make_request, unique_prompt
from .test_scheduler_structured import ANSWER, assert_valid, free, matcher

SPECULATE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}'
# The prompt quotes the reply, so the lookup drafts it; and a reply the schema
# forbids ("weeks" is no property of it), whose drafts the rows must stop at.
QUOTED = encode(f" Answer as {ANSWER}.")
FORBIDDEN = encode(' Not {"city": "Oslo", "weeks": 4}.')


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer())


def run(compiler, *, drafts: bool, async_scheduling: bool, prompt=QUOTED, script=None):
    harness = Harness(
        drafts=drafts,
        speculative_config=SPECULATE,
        speculative_drafts="fixed",
        async_scheduling=async_scheduling,
    )
    harness.worker.drafter = ngram_drafter(harness.worker, 2, 4)
    request = make_request([*unique_prompt(4), *prompt], "json", max_tokens=40)
    request.structured = matcher(compiler)
    harness.add(request, tokens=script or encode(ANSWER) + [EOS])
    free(harness, "free", max_tokens=12)
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
        check_books(harness.scheduler)
    return harness, request, plans


def expected_rows(compiler, tokens: list[int], drafts: list[int], num_rows: int) -> list:
    """The allowed ids after tokens + drafts[:j], for each row j, from a fresh matcher."""
    rows = []
    for j in range(num_rows):
        reference = matcher(compiler)
        assert all(reference.advance(t) for t in [*tokens, *drafts[:j]])
        row = np.zeros(reference.num_words, dtype=np.int32)
        reference.fill_mask(row)
        rows.append(allowed_ids(row))
    return rows


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_constrained_drafts_give_the_reply_of_plain_decodes(compiler, async_scheduling):
    plain, _, _ = run(compiler, drafts=False, async_scheduling=async_scheduling)
    harness, request, plans = run(compiler, drafts=True, async_scheduling=async_scheduling)
    assert harness.token_ids("json") == plain.token_ids("json") == [*encode(ANSWER), EOS]
    assert_valid(harness, "json")
    assert harness.token_ids("free") == plain.token_ids("free")
    drafting = [
        p
        for p in plans
        for s in p.continuing_sequences
        if s.seq_id == request.seq_id and s.num_draft_tokens
    ]
    assert drafting, "the constrained request should have drafted"
    if async_scheduling:  # planned ahead of its sample: its rows came after the plan
        assert any(request.seq_id in p.deferred_mask_seq_ids for p in drafting)
    else:
        assert all(p.allowed_tokens.has_drafts or p.allowed_tokens.row_counts for p in drafting)
    # The drafts were right (the prompt quotes the reply): fewer steps, drafts accepted.
    emitted = [n for seq_id, _, n, _ in harness.worker.draft_log if seq_id == request.seq_id]
    assert max(emitted) > 1
    stats = harness.scheduler.stats.drafts
    assert stats.num_accepted_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_draft_row_is_the_grammar_after_the_output_and_the_drafts_before(
    compiler, async_scheduling
):
    harness, request, _ = run(compiler, drafts=True, async_scheduling=async_scheduling)
    log = [entry for entry in harness.worker.draft_mask_log if entry[0] == request.seq_id]
    assert log, "some step should have masked draft positions"
    for _, output, rows, drafts in log:
        assert len(rows) == len(drafts) + 1
        expected = expected_rows(compiler, output, drafts, len(rows))
        for row, ids in zip(rows, expected, strict=True):
            assert np.array_equal(allowed_ids(row), ids)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_draft_the_grammar_forbids_is_never_emitted(compiler, async_scheduling):
    harness, request, _ = run(
        compiler, drafts=True, async_scheduling=async_scheduling, prompt=FORBIDDEN
    )
    assert harness.token_ids("json") == [*encode(ANSWER), EOS]
    assert_valid(harness, "json")
    # The lookup drafted the quoted reply's "weeks", which the schema forbids: the
    # rows stopped at that draft (its position's row forbids it), so it was rejected.
    cut = [
        (drafts, emitted, rows)
        for seq_id, drafts, emitted, rows in harness.worker.draft_log
        if seq_id == request.seq_id and rows is not None and len(rows) < 1 + len(drafts)
    ]
    assert cut, "the lookup should have drafted the forbidden continuation"
    for drafts, emitted, rows in cut:
        assert drafts[len(rows) - 1] not in rows[-1]
        assert emitted <= len(rows)
    weeks = encode(' "weeks')
    assert any(drafts[: len(weeks) - 1] == weeks[1:] for drafts, _, _ in cut)
    assert "weeks" not in harness.text("json")


def test_a_lost_mask_with_drafts_fails_that_request_only(compiler):
    harness = Harness(
        drafts=True,
        speculative_config=SPECULATE,
        speculative_drafts="fixed",
        async_scheduling=True,
    )
    harness.worker.drafter = ngram_drafter(harness.worker, 2, 4)
    request = make_request([*unique_prompt(4), *QUOTED], "lost", max_tokens=40)
    request.structured = matcher(compiler)
    harness.add(request, tokens=encode(ANSWER) + [EOS])
    free(harness, "free", max_tokens=20)
    for _ in range(60):
        deferred = [
            p
            for p in harness.in_flight
            if request.seq_id in p.deferred_mask_seq_ids
            and any(
                s.seq_id == request.seq_id and s.num_draft_tokens for s in p.continuing_sequences
            )
            and p.step_id in harness.deferred_masks
            and harness.deferred_masks[p.step_id].allowed_tokens.has_drafts
        ]
        if deferred:
            break
        harness.step()
    assert deferred, "a deferred mask with draft rows should be in flight"
    assert harness.deferred_masks.pop(deferred[0].step_id) is not None
    harness.run()
    check_books(harness.scheduler)
    error = harness.errors["lost"]
    assert error.code is grpc.StatusCode.UNAVAILABLE and "mask" in error.message
    # Nothing it sampled without its masks was streamed: what it has is a valid prefix.
    assert ANSWER.startswith(harness.text("lost"))
    assert harness.final("free").finish_reason is FinishReason.LENGTH
    assert harness.worker.sequences == {} and harness.block_manager.num_used_blocks == 0


def test_no_constrained_drafts_on_a_worker_that_does_not_read_draft_rows(compiler):
    harness = Harness(
        drafts=True,
        constrained_drafts=False,
        speculative_config=SPECULATE,
        speculative_drafts="fixed",
    )
    harness.worker.drafter = ngram_drafter(harness.worker, 2, 4)
    request = make_request([*unique_prompt(4), *QUOTED], "json", max_tokens=40)
    request.structured = matcher(compiler)
    harness.add(request, tokens=encode(ANSWER) + [EOS])
    free(harness, "free", max_tokens=12)
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
    drafted = {s.seq_id for p in plans for s in p.continuing_sequences if s.num_draft_tokens}
    assert drafted == {harness.requests["free"].seq_id}
    assert_valid(harness, "json")
