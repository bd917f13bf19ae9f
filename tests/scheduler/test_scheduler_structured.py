"""Structured outputs in the real Scheduler against the FakeWorker (which samples
only what a row's mask allows, as the real sampler does): constrained and free rows
share steps, and the output stays valid through async scheduling, multi-step plans,
preemption and a move to another worker."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from scheduler_svc.core.request import FinishReason, Request
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import Constraint

from .books import check_books
from .harness import EOS, Harness, encode, load_tokenizer, make_request, unique_prompt

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
ANSWER = '{"city": "Oslo", "days": [1, 2, 3]}'
# A schema with no open-ended string or list: any path through it ends, so a row
# whose every token is forced by the mask finishes with EOS.
FLAG = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
# What a model that ignores the schema would say: the mask must overrule it.
PROSE = encode(" Sure! The city is Oslo and the days are one, two and three.")
FREE = encode(" one two three four five six seven eight")


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer())


def matcher(compiler, schema=SCHEMA):
    return compiler.compile_now(Constraint("json_schema", json.dumps(schema))).new_matcher()


def constrained(
    compiler, harness: Harness, request_id: str, script, schema=SCHEMA, **sampling
) -> Request:
    sampling.setdefault("max_tokens", 40)
    request = make_request(unique_prompt(6), request_id, **sampling)
    request.structured = matcher(compiler, schema)
    return harness.add(request, tokens=script)


def free(harness: Harness, request_id: str, **sampling) -> Request:
    sampling.setdefault("max_tokens", 8)
    return harness.add(make_request(unique_prompt(5), request_id, **sampling), tokens=FREE)


def assert_valid(harness: Harness, request_id: str, schema=SCHEMA) -> dict:
    assert harness.final(request_id).finish_reason is FinishReason.STOP
    value = json.loads(harness.text(request_id))
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_constrained_and_free_rows_share_steps(compiler, async_scheduling):
    harness = Harness(async_scheduling=async_scheduling)
    constrained(compiler, harness, "json", encode(ANSWER) + [EOS])
    constrained(compiler, harness, "forced", PROSE, schema=FLAG)
    free(harness, "free")
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
        check_books(harness.scheduler)
    assert json.loads(harness.text("json")) == json.loads(ANSWER)
    assert_valid(harness, "json")
    assert_valid(harness, "forced", FLAG)  # the script's prose was masked out
    assert harness.token_ids("free") == FREE and harness.text("free") == load_tokenizer().decode(
        FREE
    )
    masked = [p for p in plans if p.allowed_tokens is not None or p.deferred_mask_seq_ids]
    seq_ids = {r.request_id: r.seq_id for r in harness.requests.values()}
    # Free rows sampled in the same steps as masked ones, and never got a mask row.
    assert any(seq_ids["free"] in {s.seq_id for s in p.continuing_sequences} for p in masked)
    assert all(seq_ids["free"] not in masked_seq_ids(p) for p in masked)


def masked_seq_ids(plan) -> list[int]:
    """The rows a plan masks: in the plan, and those whose masks follow it."""
    inline = plan.allowed_tokens.seq_ids if plan.allowed_tokens is not None else []
    return [*inline, *plan.deferred_mask_seq_ids]


def test_async_without_deferred_masks_never_plans_a_constrained_row_ahead_of_its_sample(
    compiler,
):
    """A worker that does not accept deferred masks (an older one)."""
    harness = Harness(async_scheduling=True, deferred_masks=False)
    request = constrained(compiler, harness, "json", encode(ANSWER) + [EOS])
    free(harness, "free", max_tokens=30)
    while harness.may_send() and (plan := harness.schedule()) is not None:
        harness.send(plan)
        while harness.may_send() and (plan := harness.schedule()) is not None:
            harness.send(plan)
        # Of the plans in flight, at most one samples for the constrained request.
        sampling = [
            p
            for p in harness.in_flight
            if p.allowed_tokens and request.seq_id in p.allowed_tokens.seq_ids
        ]
        assert len(sampling) <= 1 and request.num_pending_samples <= 1
        harness.answer_oldest()
    harness.run()
    assert_valid(harness, "json")


def test_multi_step_plans_stay_one_step_while_a_constrained_row_runs(compiler):
    harness = Harness(num_scheduler_steps=4)
    constrained(compiler, harness, "json", encode(ANSWER) + [EOS])
    free(harness, "free", max_tokens=40)
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
    assert_valid(harness, "json")
    assert all(p.num_steps == 1 for p in plans if p.allowed_tokens is not None)
    assert any(p.num_steps > 1 for p in plans), "the free row alone should go multi-step"


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(compiler):
    harness = Harness()
    constrained(compiler, harness, "short", encode(ANSWER) + [EOS], max_tokens=5)
    harness.run()
    assert harness.final("short").finish_reason is FinishReason.LENGTH
    assert ANSWER.startswith(harness.text("short"))


def test_preemption_recomputes_and_the_mask_continues_from_the_output(compiler):
    harness = Harness(num_blocks=9, block_size=4, max_num_batched_tokens=32)
    requests = [
        constrained(compiler, harness, f"json{i}", encode(ANSWER) + [EOS]) for i in range(3)
    ]
    harness.run()
    assert sum(r.num_preemptions for r in requests) >= 1, "the test needs a preemption"
    for request in requests:
        assert json.loads(harness.text(request.request_id)) == json.loads(ANSWER)


@pytest.mark.parametrize("in_flight", [False, True])
def test_after_a_worker_loss_the_matcher_is_rebuilt_from_the_output(compiler, in_flight):
    source = Harness(async_scheduling=in_flight)
    request = constrained(compiler, source, "json", encode(ANSWER) + [EOS])
    free(source, "free", max_tokens=20)
    for _ in range(6):
        source.step()
    if in_flight:
        source.send(source.schedule())  # its token is lost with the worker
    kept = list(request.output_token_ids)
    assert 0 < len(kept) < len(encode(ANSWER))
    destination = Harness(async_scheduling=in_flight)
    for moved in source.scheduler.take_unfinished():
        destination.adopt(moved, source)
    # As a core that rebuilt the request elsewhere would hold it: a matcher at the start.
    request.structured = matcher(compiler)
    plan = destination.schedule()
    row = plan.allowed_tokens.rows[plan.allowed_tokens.seq_ids.index(request.seq_id)]
    # The first mask continues the kept text: that of a matcher fed the kept tokens.
    reference = matcher(compiler)
    assert all(reference.advance(token_id) for token_id in kept)
    expected = np.zeros_like(row)
    reference.fill_mask(expected)
    assert np.array_equal(row, expected)
    assert request.structured.num_tokens == len(kept)
    destination.send(plan)
    destination.run()
    assert json.loads(destination.text("json")) == json.loads(ANSWER)
    assert_valid(destination, "json")


@pytest.mark.parametrize("sampling", [{"min_tokens": 30}, {"ignore_eos": True}, {}])
def test_a_complete_grammar_ends_with_its_forced_eos_without_a_step(compiler, sampling):
    """Once the grammar allows only EOS the request takes it and ends with STOP, even
    below min_tokens or with ignore_eos (which would otherwise mask the EOS or sample
    EOS after EOS): the output is the valid reply, then that EOS."""
    harness = Harness()
    request = constrained(compiler, harness, "flag", PROSE, schema=FLAG, **sampling)
    masked_steps = 0
    while (plan := harness.step()) is not None:
        masked_steps += bool(plan.allowed_tokens and request.seq_id in plan.allowed_tokens.seq_ids)
    value = assert_valid(harness, "flag", FLAG)
    token_ids = harness.token_ids("flag")
    assert token_ids[-1] == EOS and EOS not in token_ids[:-1]
    assert harness.final("flag").completion_tokens == len(token_ids)
    assert load_tokenizer().decode(token_ids[:-1]) == json.dumps(value)
    # A sampling step per token but the EOS: the step that could only sample it never ran.
    assert masked_steps == len(token_ids) - 1
    assert request.structured.must_end and request.structured.num_tokens == len(token_ids)


def test_a_grammar_completed_on_max_tokens_ends_with_length(compiler):
    """As in vLLM: the max_tokens-th token completes the reply, no room is left for an
    EOS, and the finish reason is LENGTH (the text is still the whole reply)."""
    size = len(encode(ANSWER))
    harness = Harness()
    constrained(compiler, harness, "exact", encode(ANSWER) + [EOS], max_tokens=size)
    harness.run()
    assert harness.final("exact").finish_reason is FinishReason.LENGTH
    assert harness.token_ids("exact") == encode(ANSWER)


def test_the_forced_eos_has_the_masked_distributions_logprob(compiler):
    harness = Harness()
    constrained(compiler, harness, "json", encode(ANSWER) + [EOS], logprobs=3)
    harness.run()
    entries = [entry for output in harness.outputs["json"] for entry in output.logprobs]
    assert len(entries) == len(harness.token_ids("json"))
    assert entries[-1].token_id == EOS and entries[-1].logprob == 0.0
    assert entries[-1].top == ((EOS, 0.0),)
