"""Deferred masks: under async scheduling a constrained row is planned every step, its
mask sent after the result before its plan (the harness runs each plan when its result
is read, with the masks the scheduler sent for it, as a worker whose sampler waits).

A mask that never comes fails that request and nothing else; a request preempted,
aborted or recomputed while its mask is pending goes on from its output."""

from __future__ import annotations

import json

import grpc
import pytest

from scheduler_svc.core.request import FinishReason
from scheduler_svc.structured.compiler import GrammarCompiler

from .books import check_books
from .harness import EOS, Harness, encode, load_tokenizer
from .test_scheduler_structured import ANSWER, assert_valid, constrained, free

SCRIPT = encode(ANSWER) + [EOS]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer())


def sampling_plans(plans, seq_id: int) -> list[int]:
    """Indices of the plans in which seq_id samples under a mask, inline or deferred."""
    indices = []
    for index, plan in enumerate(plans):
        inline = plan.allowed_tokens.seq_ids if plan.allowed_tokens is not None else []
        if seq_id in inline or seq_id in plan.deferred_mask_seq_ids:
            indices.append(index)
    return indices


def test_a_constrained_row_is_planned_in_consecutive_plans(compiler):
    harness = Harness(async_scheduling=True)
    request = constrained(compiler, harness, "json", SCRIPT)
    free(harness, "free", max_tokens=30)
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
        check_books(harness.scheduler)
    assert_valid(harness, "json")
    assert json.loads(harness.text("json")) == json.loads(ANSWER)
    steps = sampling_plans(plans, request.seq_id)
    # One plan per token (and one past the forced EOS, whose token is dropped), with
    # no gap: every step samples for it, not every other one.
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert len(steps) >= len(harness.token_ids("json")) - 1
    # The first has its mask in the plan (no token in flight); the others defer it.
    assert request.seq_id in plans[steps[0]].allowed_tokens.seq_ids
    assert all(request.seq_id in plans[i].deferred_mask_seq_ids for i in steps[1:])
    assert harness.worker.sequences == {}


def test_a_lost_mask_fails_that_request_only(compiler):
    harness = Harness(async_scheduling=True)
    lost = constrained(compiler, harness, "lost", SCRIPT)
    kept = constrained(compiler, harness, "kept", SCRIPT)
    free(harness, "free", max_tokens=20)
    for _ in range(4):
        harness.step()
    deferred = [p for p in harness.in_flight if lost.seq_id in p.deferred_mask_seq_ids]
    assert deferred, "the next plan in flight should defer its mask"
    # The scheduler's message for that plan (sent already) never arrives.
    assert harness.deferred_masks.pop(deferred[0].step_id) is not None
    harness.run()
    check_books(harness.scheduler)
    error = harness.errors["lost"]
    assert error.code is grpc.StatusCode.UNAVAILABLE and "mask" in error.message
    assert not harness.finished("lost")
    # Nothing it sampled without its mask was streamed: what it has is a valid prefix.
    assert ANSWER.startswith(harness.text("lost"))
    # The other constrained row of the same message missed it too; the free row did not.
    assert kept.seq_id in deferred[0].deferred_mask_seq_ids and "kept" in harness.errors
    assert harness.final("free").finish_reason is FinishReason.LENGTH
    assert harness.worker.sequences == {} and harness.block_manager.num_used_blocks == 0


def test_a_mask_message_without_a_row_fails_that_row_only(compiler):
    harness = Harness(async_scheduling=True)
    dropped = constrained(compiler, harness, "dropped", SCRIPT)
    kept = constrained(compiler, harness, "kept", SCRIPT)
    for _ in range(3):
        harness.step()
    masks = harness.deferred_masks[harness.in_flight[0].step_id]
    rows = masks.allowed_tokens
    assert set(rows.seq_ids) == {dropped.seq_id, kept.seq_id}
    # A scheduler bug that leaves one row out: the worker reports that row missing.
    index = rows.seq_ids.index(dropped.seq_id)
    rows.seq_ids.pop(index)
    rows.row_counts.pop(index)
    rows._rows = rows._rows[[i for i in range(len(rows._rows)) if i != index]]
    rows._num_rows -= 1
    harness.run()
    assert "mask" in harness.errors["dropped"].message
    assert json.loads(harness.text("kept")) == json.loads(ANSWER)
    assert_valid(harness, "kept")


def test_an_abort_while_its_mask_is_pending_leaves_the_others_masked(compiler):
    harness = Harness(async_scheduling=True)
    aborted = constrained(compiler, harness, "aborted", SCRIPT)
    constrained(compiler, harness, "kept", SCRIPT)
    for _ in range(3):
        harness.step()
    assert aborted.seq_id in harness.in_flight[-1].deferred_mask_seq_ids
    harness.scheduler.abort_request("aborted")
    harness.run()
    check_books(harness.scheduler)
    # Its row was left out of the message; its unmasked token was dropped, no error.
    assert "aborted" not in harness.errors and "kept" not in harness.errors
    assert ANSWER.startswith(harness.text("aborted"))
    assert_valid(harness, "kept")
    assert harness.worker.sequences == {}


def test_preemption_while_masks_are_pending_recomputes_from_the_output(compiler):
    harness = Harness(async_scheduling=True, num_blocks=9, block_size=4, max_num_batched_tokens=32)
    requests = [constrained(compiler, harness, f"json{i}", SCRIPT) for i in range(3)]
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
        check_books(harness.scheduler)
    assert sum(r.num_preemptions for r in requests) >= 1, "the test needs a preemption"
    # A plan that drops a request went out while the plan before it deferred its mask:
    # that mask's token is dropped, and the recompute starts with a mask in its plan.
    pending = [
        (before, after)
        for before, after in zip(plans, plans[1:], strict=False)
        if set(before.deferred_mask_seq_ids) & set(after.finished_seq_ids)
    ]
    assert pending, "the test needs a preemption while a mask is pending"
    for request in requests:
        assert json.loads(harness.text(request.request_id)) == json.loads(ANSWER)
        assert_valid(harness, request.request_id)
    assert harness.worker.sequences == {} and harness.block_manager.num_used_blocks == 0
