"""Structured outputs under load, through the official `openai` client on the session's
stack: JSON schemas validate, a named tool's arguments validate, choice and regex hold,
with 32 unconstrained streams in the same batches. One request at a time (a cut JSON
object, a streamed tool call, refusals, gRPC): test_structured_requests.py."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema

from tests.integration.structured import NAME, WEATHER_TOOL, chat


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
# The issue's load: 32 unconstrained streams in the same batches as the constrained
# requests; short ones, enough to run through the constrained requests' prefill and
# first steps, so that the module stays quick on 2 cores.
FREE_STREAMS = 16
FREE_TOKENS = 24


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
