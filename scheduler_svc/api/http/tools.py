"""Tool calling over chat completions: what `tools` and `tool_choice` ask of the
request, and the reply read back as `tool_calls`.

The chat template receives the tools. With tool_choice "required" or a named
function, the reply is constrained (a JSON schema, scheduler_svc/structured) to a
call: a named function's arguments object, or {"name", "arguments"} for one of
the tools; it is then always a call. With "auto" the reply is free and becomes a
call only if it is one ({"name", "arguments"} JSON, bare or in <tool_call> tags,
naming a tool). "none" hides the tools from the template, as if none were given.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from scheduler_svc.api.http.protocol import ChatCompletionRequest, NamedToolChoice

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
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
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
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
