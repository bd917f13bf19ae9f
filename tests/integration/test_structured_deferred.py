"""Deferred masks on the real model: a greedy constrained reply is the same whether its
masks ride in the plans (one plan at a time, as before deferred masks) or follow them
(async scheduling: the session's stack, where every step after the first defers the
row's mask). Checked once against the code before the change too: same token ids."""

from __future__ import annotations

import json

import grpc
import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.stacks import started_stack, stop_stack

# Closed by hand (additionalProperties false), so that how a schema is compiled by
# default does not enter this comparison.
BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "author": {
            "type": "object",
            "properties": {
                "first": {"type": "string", "maxLength": 20},
                "last": {"type": "string", "maxLength": 20},
            },
            "required": ["first", "last"],
            "additionalProperties": False,
        },
        "year": {"type": "integer"},
    },
    "required": ["title", "author", "year"],
    "additionalProperties": False,
}
WORK = [
    ("Describe a book in JSON.", pb.StructuredOutput(json_schema=json.dumps(BOOK))),
    ("Give a date.", pb.StructuredOutput(regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]")),
    ("Is water wet?", pb.StructuredOutput(choice=pb.ChoiceList(choices=["yes", "no"]))),
]


@pytest.fixture(scope="module")
def one_plan_at_a_time():
    """A float32 stack like the session's, without async scheduling: masks in the plans."""
    stack = started_stack(
        worker_args=["--dtype", "float32"], scheduler_args=["--no-async-scheduling"]
    )
    yield stack
    stop_stack(stack)


def replies(stack, work=WORK) -> list[list[int]]:
    token_ids = []
    with grpc.insecure_channel(stack.address) as channel:
        generate = pb_grpc.GenerationStub(channel).Generate
        for text, constraint in work:
            request = pb.GenerateRequest(
                chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=text)]),
                sampling=pb.SamplingParams(temperature=0.0, max_tokens=80),
                structured_output=constraint,
            )
            token_ids.append([t for response in generate(request) for t in response.token_ids])
    return token_ids


def test_greedy_constrained_replies_are_the_same_with_deferred_masks(stack, one_plan_at_a_time):
    deferred = replies(stack)
    assert deferred == replies(one_plan_at_a_time)
    assert all(ids[-1] == 2 for ids in deferred)  # each reply ended with its EOS
