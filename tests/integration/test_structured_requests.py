"""Structured outputs one request at a time, on the session's stack: a JSON object cut
by max_tokens is never claimed complete, a required tool call streams as one call,
bad constraints are refused with 400, and gRPC gets the same constraints and the same
refusals. Under load beside free streams: test_structured_outputs.py."""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.structured import MAX_TOKENS, WEATHER_TOOL, chat


def test_json_object_is_never_claimed_complete_when_cut(openai_api):
    reply = chat(
        openai_api,
        "Reply with a JSON object whose key ok is true.",
        response_format={"type": "json_object"},
        max_tokens=24,
    )
    [choice] = reply.choices
    assert choice.message.content.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # an open object may run to max_tokens: then it says length
        assert choice.finish_reason == "length"


def test_streamed_required_tool_call(openai_api):
    stream = openai_api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Weather in Oslo, please."}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        stream=True,
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    calls = [call for c in chunks for call in c.delta.tool_calls or ()]
    assert chunks[-1].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(
        json.loads(calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"]
    )


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "nope",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "a("}}}, "unclosed group"),
        ({"extra_body": {"structured_outputs": {"grammar": "start: missing"}}}, "unknown name"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "not one of the tools",
        ),
    ],
)
def test_bad_constraints_are_refused_with_400(openai_api, fields, words):
    with pytest.raises(openai.BadRequestError, match=words):
        chat(openai_api, "hi", **fields)


def test_grpc_gets_the_same_constraints_and_refusals(stack):
    with grpc.insecure_channel(stack.address) as channel:
        generate = pb_grpc.GenerationStub(channel).Generate
        request = pb.GenerateRequest(
            chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="Pick one.")]),
            sampling=pb.SamplingParams(temperature=0.0, max_tokens=16),
            structured_output=pb.StructuredOutput(choice=pb.ChoiceList(choices=["alpha", "beta"])),
        )
        text = "".join(response.text for response in generate(request))
        assert text in ("alpha", "beta")
        request.structured_output.CopyFrom(pb.StructuredOutput(json_schema='{"type": 7}'))
        with pytest.raises(grpc.RpcError) as refused:
            list(generate(request))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("structured_output.json_schema:")
