"""Structured replies that close (issue 32, item 0), on the session's stack and the
default model, through the official `openai` client: held-out schemas of the kind
that ran to `length` while schemas were compiled open (a book with a nested author,
a named get_weather call), as their users write them (no additionalProperties, no
bounds), give greedy replies that parse and validate within max_tokens, with no
property the schema does not name; a forced call cut by max_tokens is still a call,
with finish_reason "length"."""

from __future__ import annotations

import json

import jsonschema
import pytest

from scheduler_svc.structured.closed_schema import closed_schema
from tests.integration.structured import chat

MAX_TOKENS = 160
TEXT = {"type": "string"}
BOOK = {
    "type": "object",
    "properties": {
        "title": TEXT,
        "author": {
            "type": "object",
            "properties": {"first": TEXT, "last": TEXT},
            "required": ["first", "last"],
        },
        "year": {"type": "integer"},
    },
    "required": ["title", "author", "year"],
}
PERSON = {
    "type": "object",
    "properties": {
        "name": TEXT,
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"street": TEXT, "city": TEXT},
            "required": ["street", "city"],
        },
    },
    "required": ["name", "age", "address"],
}
PRODUCT = {
    "type": "object",
    "properties": {"name": TEXT, "price": {"type": "number"}, "in_stock": {"type": "boolean"}},
    "required": ["name", "price", "in_stock"],
}
MOVIE = {
    "type": "object",
    "properties": {
        "name": TEXT,
        "director": TEXT,
        "year": {"type": "integer"},
        "genres": {"type": "array", "items": TEXT},
    },
    "required": ["name", "director", "year", "genres"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": TEXT,
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_QUESTION = "What's the weather like in Paris today?"


def strictly_valid(value, schema) -> None:
    """Valid, and with no property the schema does not name."""
    jsonschema.validate(value, schema)
    jsonschema.validate(value, closed_schema(schema))


@pytest.mark.parametrize(
    ("text", "schema"),
    [
        ("Recommend a book. Answer in JSON.", BOOK),
        ("Invent a person with an address. Reply in JSON.", PERSON),
        ("Describe a product for sale in JSON.", PRODUCT),
        ("Describe a famous movie as JSON.", MOVIE),
    ],
    ids=["book", "person", "product", "movie"],
)
def test_held_out_schemas_close_within_max_tokens(openai_api, text, schema):
    form = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    reply = chat(openai_api, text, max_tokens=MAX_TOKENS, response_format=form)
    [choice] = reply.choices
    assert choice.finish_reason == "stop", choice.message.content
    strictly_valid(json.loads(choice.message.content), schema)


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_get_weather_call_closes(openai_api, tool_choice):
    reply = chat(openai_api, WEATHER_QUESTION, MAX_TOKENS, tools=[WEATHER], tool_choice=tool_choice)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    strictly_valid(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


# Cut inside the arguments: a required call writes {"name": ..., "arguments": first.
@pytest.mark.parametrize(
    ("tool_choice", "cut_at"), [(NAMED, 5), ("required", 16)], ids=["named", "required"]
)
def test_a_forced_call_cut_by_max_tokens_is_a_call_with_length(openai_api, tool_choice, cut_at):
    fields = {"tools": [WEATHER], "tool_choice": tool_choice}
    [choice] = chat(openai_api, WEATHER_QUESTION, cut_at, **fields).choices
    assert choice.finish_reason == "length" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    # Cut, so not complete JSON: the arguments as written, as vLLM returns them.
    whole = chat(openai_api, WEATHER_QUESTION, MAX_TOKENS, **fields).choices[0]
    full_arguments = whole.message.tool_calls[0].function.arguments
    assert call.function.arguments and full_arguments.startswith(call.function.arguments)
    stream = openai_api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": WEATHER_QUESTION}],
        temperature=0.0,
        max_tokens=cut_at,
        stream=True,
        **fields,
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    [streamed] = [call for c in chunks for call in c.delta.tool_calls or ()]
    assert chunks[-1].finish_reason == "length"
    assert streamed.function.arguments == call.function.arguments
