"""Tool calling over chat completions: what `tools` and `tool_choice` ask of the
request, and the reply read back as `tool_calls`.

The chat template receives the tools. With tool_choice "required" or a named
function, the reply is constrained (a JSON schema, scheduler_svc/structured) to a
call: a named function's arguments object, or {"name", "arguments"} for one of
the tools; it is then always a call. With "auto" the reply is free and becomes a
call only if it is one ({"name", "arguments"} JSON, bare or in <tool_call> tags,
naming a tool). "none" hides the tools from the template, as if none were given.

A forced call cut by max_tokens is still a call, as vLLM returns it (with
finish_reason "length"): its arguments are the text as it was cut, usually not
complete JSON, for the client to see what it got.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from scheduler_svc.api.http.protocol import ChatCompletionRequest, NamedToolChoice

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
# The start of a "required" reply: the grammar writes "name" first, then "arguments"
# (llguidance keeps the schema's property order). The name's closing quote and the
# arguments may be missing from a cut reply.
_CUT_CALL = re.compile(
    r'\s*\{\s*"name"\s*:\s*"(?P<name>[^"]*)(?P<closed>")?(?P<arguments>\s*,\s*"arguments"\s*:\s*)?',
)
# A function without a parameters schema takes any object, as OpenAI reads it.
_ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    # name -> parameters schema, in the body's order.
    functions: dict[str, dict]
    # "auto", "required", or "named" (then `named` is the function).
    mode: str
    named: str | None = None

    @property
    def forced(self) -> bool:
        """The reply is constrained to a call, so it is one."""
        return self.mode != "auto"

    def constraint(self) -> pb.StructuredOutput | None:
        if self.mode == "named":
            return _schema_output(self.functions[self.named])
        if self.mode == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for name, parameters in self.functions.items()
            ]
            return _schema_output(calls[0] if len(calls) == 1 else {"anyOf": calls})
        return None

    def calls(self, text: str) -> list[dict] | None:
        """The reply as OpenAI's tool_calls, or None if it is not a call."""
        if self.mode == "named":
            try:
                arguments = json.loads(text)
            except json.JSONDecodeError:
                return None
            return [_call(self.named, arguments)]
        call = _parse_call(text)
        if call is None or call[0] not in self.functions:
            return None
        return [_call(*call)]

    def cut_calls(self, text: str) -> list[dict] | None:
        """A forced call cut short (by max_tokens): the call with its arguments as they
        were cut; None for "auto", whose cut text may never have been a call."""
        if self.mode == "named":
            return [_raw_call(self.named, text)]
        if self.mode != "required":
            return None
        whole = _parse_call(text)  # complete, by the max_tokens-th token
        if whole is not None and whole[0] in self.functions:
            return [_call(*whole)]
        start = _CUT_CALL.match(text)
        if start is None:  # cut before the name began
            return [_raw_call(self._cut_name(""), "")]
        name = start["name"] if start["closed"] else self._cut_name(start["name"])
        return [_raw_call(name, text[start.end() :] if start["arguments"] else "")]

    def _cut_name(self, prefix: str) -> str:
        """The one tool a cut name can only be (the grammar allows tool names only),
        else the name as far as it was written."""
        matches = [name for name in self.functions if name.startswith(prefix)]
        return matches[0] if len(matches) == 1 else prefix

    def may_become_call(self, text: str) -> bool:
        """Whether a reply that starts with text may still turn out to be a call: a
        stream holds such text back instead of sending it as content."""
        if self.forced:
            return True
        stripped = text.lstrip()
        return not stripped or stripped.startswith("{") or _TAG_OPEN.startswith(stripped[:11])


def tool_plan(body: ChatCompletionRequest) -> ToolPlan | None:
    """None when no tools are offered, or tool_choice is "none"."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise InvalidArgument("tool_choice", "needs tools")
        return None
    if choice == "none":
        return None
    functions: dict[str, dict] = {}
    for index, tool in enumerate(body.tools):
        name = tool.function.name
        if name in functions:
            raise InvalidArgument(f"tools[{index}].function.name", f"{name!r} is listed twice")
        functions[name] = tool.function.parameters or _ANY_OBJECT
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in functions:
            raise InvalidArgument(
                "tool_choice.function.name", f"{choice.function.name!r} is not one of the tools"
            )
        return ToolPlan(functions, "named", choice.function.name)
    return ToolPlan(functions, choice or "auto")


def template_tools(body: ChatCompletionRequest) -> list[pb.Tool]:
    return [
        pb.Tool(
            name=tool.function.name,
            description=tool.function.description or "",
            parameters_json=json.dumps(tool.function.parameters)
            if tool.function.parameters is not None
            else "",
        )
        for tool in body.tools or ()
    ]


def _schema_output(schema: dict) -> pb.StructuredOutput:
    return pb.StructuredOutput(json_schema=json.dumps(schema))


def _call(name: str, arguments: object) -> dict:
    return _raw_call(name, json.dumps(arguments, ensure_ascii=False))


def _raw_call(name: str, arguments: str) -> dict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _parse_call(text: str) -> tuple[str, object] | None:
    body = text.strip()
    if body.startswith(_TAG_OPEN):
        body = body.removeprefix(_TAG_OPEN).removesuffix(_TAG_CLOSE).strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return value["name"], arguments
