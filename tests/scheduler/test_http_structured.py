"""The HTTP front's structured outputs and tools, without a stack: bodies -> the proto's
constraint, and replies -> tool_calls (whole and streamed)."""

from __future__ import annotations

import json

import pytest

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from scheduler_svc.api.http.chat import ChatShaper
from scheduler_svc.api.http.protocol import ChatCompletionRequest, CompletionRequest
from scheduler_svc.api.http.tools import tool_plan
from scheduler_svc.api.http.translate import chat_requests, completion_requests

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "time"}},
]


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)


def _constraint(body) -> pb.StructuredOutput:
    [choice] = chat_requests(body, "id")
    return choice.request.structured_output


def test_response_format_and_structured_outputs_become_the_proto_constraint():
    schema = {"type": "object"}
    assert _constraint(_chat(response_format={"type": "json_object"})).json_object
    form = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert json.loads(_constraint(_chat(response_format=form)).json_schema) == schema
    assert not _constraint(_chat(response_format={"type": "text"})).WhichOneof("kind")
    for given, expected in [
        ({"json": schema}, pb.StructuredOutput(json_schema=json.dumps(schema))),
        ({"regex": "a+"}, pb.StructuredOutput(regex="a+")),
        ({"choice": ["x", "y"]}, pb.StructuredOutput(choice=pb.ChoiceList(choices=["x", "y"]))),
        ({"grammar": 'start: "a"'}, pb.StructuredOutput(grammar='start: "a"')),
    ]:
        assert _constraint(_chat(structured_outputs=given)) == expected
    [choice] = completion_requests(
        CompletionRequest(prompt="p", structured_outputs={"regex": "b"}), "i"
    )
    assert choice.request.structured_output.regex == "b"


@pytest.mark.parametrize(
    "fields",
    [
        {"structured_outputs": {"regex": "a", "choice": ["b"]}},
        {"structured_outputs": {}},
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        {"response_format": {"type": "json_schema"}},
        {"tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
    ],
)
def test_conflicting_or_incomplete_fields_are_refused(fields):
    with pytest.raises(InvalidArgument):
        chat_requests(_chat(**fields), "id")


def test_tools_reach_the_template_and_forced_choices_constrain_the_reply():
    [choice] = chat_requests(_chat(tools=TOOLS), "id")
    assert [t.name for t in choice.request.chat.tools] == ["weather", "time"]
    assert json.loads(choice.request.chat.tools[0].parameters_json) == PARAMS
    assert not choice.request.HasField("structured_output")  # auto: free text
    named = {"type": "function", "function": {"name": "weather"}}
    assert json.loads(_constraint(_chat(tools=TOOLS, tool_choice=named)).json_schema) == PARAMS
    required = json.loads(_constraint(_chat(tools=TOOLS, tool_choice="required")).json_schema)
    assert [c["properties"]["name"]["const"] for c in required["anyOf"]] == ["weather", "time"]
    [none] = chat_requests(_chat(tools=TOOLS, tool_choice="none"), "id")
    assert not none.request.chat.tools


def test_auto_replies_become_calls_only_when_they_are_one():
    plan = tool_plan(_chat(tools=TOOLS))
    [call] = plan.calls('<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>')
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert plan.calls('{"name": "unknown", "arguments": {}}') is None
    assert plan.calls("It is sunny.") is None
    assert (
        plan.may_become_call("  {")
        and plan.may_become_call("<tool")
        and not plan.may_become_call("It")
    )


def _response(text: str, finish=pb.FINISH_REASON_UNSPECIFIED) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, finish_reason=finish)


def _shaper(body) -> ChatShaper:
    return ChatShaper("id", "m", chat_requests(body, "id"), str, tools=tool_plan(body))


def test_a_streamed_call_is_held_back_and_sent_whole_at_the_end():
    shaper = _shaper(_chat(tools=TOOLS, tool_choice="required"))
    assert shaper.chunk_choices(0, _response('{"name": "weather", '), True) == []
    [last] = shaper.chunk_choices(0, _response('"arguments": {"city": "Rome"}}', pb.STOP), False)
    assert last["finish_reason"] == "tool_calls"
    [call] = last["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}


def test_auto_text_that_is_not_a_call_streams_as_content():
    shaper = _shaper(_chat(tools=TOOLS))
    assert shaper.chunk_choices(0, _response(" "), True) == []
    [first] = shaper.chunk_choices(0, _response("Hello"), False)
    assert first["delta"] == {"role": "assistant", "content": " Hello"}
    [second] = shaper.chunk_choices(0, _response(" there", pb.STOP), False)
    assert second["delta"] == {"content": " there"} and second["finish_reason"] == "stop"
    whole = shaper.full_choice(0, [_response("Hi", pb.STOP)])
    assert whole["message"] == {"role": "assistant", "content": "Hi"}


def test_a_forced_call_cut_by_max_tokens_is_a_call_that_says_length():
    named = {"type": "function", "function": {"name": "weather"}}
    shaper = _shaper(_chat(tools=TOOLS, tool_choice=named))
    whole = shaper.full_choice(0, [_response('{"city": "Ro', pb.LENGTH)])
    assert whole["finish_reason"] == "length" and whole["message"]["content"] is None
    [call] = whole["message"]["tool_calls"]
    # The arguments as they were cut, not completed or dropped (as vLLM returns them).
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Ro'}
    assert shaper.chunk_choices(0, _response('{"city": '), True) == []
    [last] = shaper.chunk_choices(0, _response('"Ro', pb.LENGTH), False)
    assert last["finish_reason"] == "length"
    assert last["delta"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Ro'


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ('{"name": "weather", "arguments": {"city": "Ro', "weather", '{"city": "Ro'),
        ('{"name": "weather", "arg', "weather", ""),
        ('{"name": "wea', "weather", ""),  # only one tool starts so
        ('{"name": "', "", ""),  # two tools could: the name as far as it was written
        ('{"name": "time", "arguments": {}}', "time", "{}"),  # complete at the limit
    ],
)
def test_a_required_call_cut_by_max_tokens_keeps_what_was_written(text, name, arguments):
    shaper = _shaper(_chat(tools=TOOLS, tool_choice="required"))
    whole = shaper.full_choice(0, [_response(text, pb.LENGTH)])
    assert whole["finish_reason"] == "length"
    [call] = whole["message"]["tool_calls"]
    assert call["function"] == {"name": name, "arguments": arguments}


def test_an_auto_reply_cut_by_max_tokens_stays_text():
    shaper = _shaper(_chat(tools=TOOLS))
    whole = shaper.full_choice(0, [_response('{"name": "weather", "argu', pb.LENGTH)])
    assert whole["finish_reason"] == "length" and "tool_calls" not in whole["message"]
    assert whole["message"]["content"] == '{"name": "weather", "argu'
