"""Speculative decoding on the real processes (issue 32): with
`--speculative-config` (n-gram drafts, vLLM's JSON) the stack streams exactly what it
streams without, greedy, on float32, one request at a time and all at once; prompts
whose answers repeat them get drafts accepted (the spec_decode counters say so) and
take fewer steps than tokens; a JSON-schema reply still validates. Constrained replies
draft too (their masks follow the drafts, per position): greedy, they are those of the
plain stack, with their masks after the plans (async scheduling) and in them (one plan
at a time), and the counters show drafts verified and accepted for them."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from cbserve.local_stack import free_port
from cbserve.v1 import generation_pb2 as pb
from tests.integration.stacks import started_stack, stop_stack
from tests.integration.structured import WEATHER_TOOL
from tests.integration.test_multi_step import all_at_once, one_at_a_time, steps_taken
from tests.integration.test_structured_deferred import BOOK, WORK, replies

SPECULATIVE = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
)
CODE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)
CASES = [
    dict(chat=[("user", f"Repeat this code exactly:\n{CODE}")], max_tokens=32),
    dict(chat=[("user", "Copy this line: red green blue red green blue red green")], max_tokens=16),
    dict(chat=[("user", "What is the capital of France?")], max_tokens=24),
    dict(chat=[("user", "Write a haiku about the sea.")], max_tokens=20, stop=["\n\n"]),
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.fixture(scope="module")
def speculative_stack():
    port = free_port()
    running = started_stack(
        worker_args=["--dtype", "float32"],
        # fixed: drafts in every decode, whatever the measured cost of a row on float32
        # here, so that the counters below have something to count.
        scheduler_args=[*SPECULATIVE_FLAGS, "--http-port", str(port)],
    )
    running.http_port = port
    yield running
    stop_stack(running)


SPECULATIVE_FLAGS = ["--speculative-config", SPECULATIVE, "--speculative-drafts", "fixed"]
A_BOOK = {"title": "Dune", "author": {"first": "Frank", "last": "Herbert"}, "year": 1965}
WEATHER = WEATHER_TOOL["function"]["parameters"]
# Constrained replies whose text the prompt holds (drafts found and accepted), and
# the deferred-mask test's, whose drafts are few.
CONSTRAINED = [
    (
        f"Copy this JSON exactly: {json.dumps(A_BOOK)}",
        pb.StructuredOutput(json_schema=json.dumps(BOOK)),
    ),
    (
        'Answer in JSON like {"city": "Oslo", "unit": "celsius"}: the weather in Oslo?',
        pb.StructuredOutput(json_schema=json.dumps(WEATHER)),
    ),
    *WORK,
]


@pytest.fixture(scope="module")
def speculative_sync_stack():
    """Speculation with one plan at a time: a constrained row's masks ride in its plan."""
    running = started_stack(
        worker_args=["--dtype", "float32"],
        scheduler_args=[*SPECULATIVE_FLAGS, "--no-async-scheduling"],
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def expected(stack) -> list[tuple]:
    """Plain decoding's replies, all at once: batched greedy decoding streams what one
    request at a time does (test_multi_step.py's reference rests on it too, and
    test_correctness.py holds both to transformers' generate), in less time."""
    return all_at_once(stack.address, CASES)


def counters(stack) -> dict[str, float]:
    return {
        name: value
        for name, value in stack.metrics().items()
        if name.startswith("cbserve_spec_decode_")
    }


def test_greedy_replies_are_those_of_plain_decoding(speculative_stack, expected):
    before_steps, before = steps_taken(speculative_stack), counters(speculative_stack)
    assert one_at_a_time(speculative_stack.address, CASES) == expected
    after = counters(speculative_stack)
    drafts = after["cbserve_spec_decode_num_drafts_total"] - before.get(
        "cbserve_spec_decode_num_drafts_total", 0
    )
    accepted = after["cbserve_spec_decode_num_accepted_tokens_total"] - before.get(
        "cbserve_spec_decode_num_accepted_tokens_total", 0
    )
    assert drafts > 0 and accepted > 0, after
    # Accepted drafts are tokens no step of their own was needed for (async scheduling
    # costs each request one step past its end).
    num_tokens = sum(len(token_ids) for token_ids, _, _ in expected)
    steps = steps_taken(speculative_stack) - before_steps
    assert steps <= num_tokens - accepted + 2 * len(CASES), (steps, num_tokens, accepted)


def test_batched_replies_are_those_of_plain_decoding(speculative_stack, expected):
    assert all_at_once(speculative_stack.address, CASES) == expected


def test_a_json_schema_reply_validates_with_speculation_on(speculative_stack):
    base_url = f"http://127.0.0.1:{speculative_stack.http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as api:
        reply = api.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "A trip: which city, how many days? JSON."}],
            temperature=0.0,
            max_tokens=64,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "trip", "schema": SCHEMA},
            },
        )
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    assert reply.choices[0].finish_reason == "stop"


# Masks in the plan (no async scheduling) in the slow tier: a float32 stack of its own
# and 20 s of the suite, where the fake worker's tests (tests/scheduler/
# test_scheduler_constrained_drafts.py) and the real model's step (tests/worker/
# test_constrained_drafts.py) cover that path in make test.
# Both in make test-slow (17 s for deferred): make test validates constrained replies
# on speculating workers in test_structured_faults.py (two_speculative_workers).
@pytest.mark.parametrize(
    "masks", [pytest.param(m, marks=pytest.mark.slow) for m in ("deferred", "in the plan")]
)
def test_greedy_constrained_replies_are_those_of_plain_decoding(
    request, stack, speculative_stack, masks
):
    """Only constrained requests run while the counters are read: their drafts are the
    ones counted, so the comparison is not vacuous."""
    spec = (
        speculative_stack
        if masks == "deferred"
        else request.getfixturevalue("speculative_sync_stack")
    )
    before = counters(spec)
    token_ids = replies(spec, CONSTRAINED)
    after = counters(spec)
    assert token_ids == replies(stack, CONSTRAINED)
    assert all(ids[-1] == 2 for ids in token_ids)  # each reply ended with its EOS
    grew = {name: after[name] - before.get(name, 0) for name in after}
    assert grew["cbserve_spec_decode_num_draft_tokens_total"] > 0, grew
    assert grew["cbserve_spec_decode_num_accepted_tokens_total"] > 0, grew
