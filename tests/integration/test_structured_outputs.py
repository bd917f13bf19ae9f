"""Structured outputs and tool calls through the official `openai` client on the
session's stack: JSON schemas validate, a named tool's arguments validate, choice and
regex hold, with 32 unconstrained streams in the same batches; gRPC gets the same
constraints and the same refusals."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import openai
import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc

# Bounded strings and lists: a small model that likes to ramble still has to close them.
NAME = {"type": "string", "maxLength": 12}


def closed(schema):
    """The schema with no properties beyond those listed (as OpenAI's strict mode asks)
    and bounded integers: open objects and unbounded digits let a 135M model go on
    until max_tokens (seen: extra keys, "v": 1000000...)."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
        if schema.get("type") == "integer":
            schema.setdefault("minimum", 0)
            schema.setdefault("maximum", 99999)
    elif isinstance(schema, list):
        schema = [closed(value) for value in schema]
    return schema


SCHEMAS = [
    {"type": "object", "properties": {"name": NAME}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "maxItems": 3}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": NAME, "age": {"type": "integer"}},
                "required": ["name", "age"],
            }
        },
        "required": ["person"],
    },
    {
        "type": "object",
        "properties": {"city": NAME, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
        "required": ["scores"],
    },
    {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
    },
    {
        "type": "object",
        "properties": {"title": NAME, "year": {"type": "integer"}},
        "required": ["title", "year"],
    },
    {
        "type": "object",
        "properties": {
            "point": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
        },
        "required": ["point"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "done": {"type": "boolean"}},
                    "required": ["id", "done"],
                    "additionalProperties": False,
                },
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"]},
    {
        "type": "object",
        "properties": {"first": NAME, "last": NAME, "middle": {"anyOf": [NAME, {"type": "null"}]}},
        "required": ["first", "last", "middle"],
    },
    {
        "type": "object",
        "properties": {"unit": {"enum": ["kg", "lb"]}, "weight": {"type": "integer"}},
        "required": ["unit", "weight"],
    },
    {
        "type": "object",
        "properties": {
            "meta": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
        },
        "required": ["meta"],
    },
]
SCHEMAS = [closed(schema) for schema in SCHEMAS]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
MAX_TOKENS = 64
# The issue's load: 32 unconstrained streams in the same batches as the constrained
# requests; short ones, enough to run through the constrained requests' prefill and
# first steps, so that the module stays quick on 2 cores.
FREE_STREAMS = 32
FREE_TOKENS = 24


def chat(api, text: str, max_tokens: int = MAX_TOKENS, **fields):
    return api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": text}],
        temperature=0.0,
        max_tokens=max_tokens,
        **fields,
    )


def free_stream(api, index: int) -> str:
    stream = api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": f"Tell me a story about the number {index}."}],
        temperature=0.8,
        seed=index,
        max_tokens=FREE_TOKENS,
        stream=True,
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


class PeakRunning:
    """The most requests the scheduler had running at once, polled from its /metrics
    in a thread: on a one-worker stack every running request is in every step it can
    sample in, so a peak of free + constrained requests means they shared steps."""

    def __init__(self, stack) -> None:
        self._stack = stack
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._done.wait(0.02):
            running = self._stack.metrics()["cbserve_num_requests_running"]
            self.peak = max(self.peak, int(running))

    def __enter__(self) -> PeakRunning:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


DATE = r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"


def constrained_work(api) -> list:
    """(what to check against, fields) of every kind of constraint, run beside free
    streams: 16 JSON schemas, a named tool, a choice and a regex."""
    work = [
        (
            schema,
            "Answer with JSON.",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
                }
            },
        )
        for i, schema in enumerate(SCHEMAS)
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    work.append(
        (
            WEATHER_TOOL["function"]["parameters"],
            "What is the weather in Paris?",
            {"tools": [WEATHER_TOOL], "tool_choice": named},
        )
    )
    choice = {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}
    work.append(("choice", "Is the sky blue?", {"extra_body": choice}))
    regex = {"structured_outputs": {"regex": DATE}}
    work.append(("regex", "Give a date.", {"extra_body": regex}))
    return [(kind, lambda t=text, f=fields: chat(api, t, **f)) for kind, text, fields in work]


def check(kind, reply) -> None:
    [choice] = reply.choices
    if kind == "choice":
        assert choice.message.content in ("yes", "no", "maybe")
    elif kind == "regex":
        assert re.fullmatch(DATE, choice.message.content)
    elif kind is WEATHER_TOOL["function"]["parameters"]:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), kind)
    else:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), kind)


def test_constraints_hold_while_free_streams_share_the_batches(openai_api, stack):
    work = constrained_work(openai_api)
    with PeakRunning(stack) as running, ThreadPoolExecutor(len(work) + FREE_STREAMS) as pool:
        free = [pool.submit(free_stream, openai_api, i) for i in range(FREE_STREAMS)]
        constrained = [(kind, pool.submit(job)) for kind, job in work]
        for kind, future in constrained:
            check(kind, future.result(timeout=300))
        assert all(future.result(timeout=300) for future in free)
    # Every constrained request ran beside most free streams (a few may have ended
    # before the last constrained request was admitted).
    assert running.peak >= len(work) + FREE_STREAMS * 3 // 4, running.peak


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
