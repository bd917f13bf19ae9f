"""The request bodies of /v1/chat/completions and /v1/completions, in OpenAI's field names.

Only the types are checked here (a wrong type is a 400 naming the field); the ranges
are checked by the one request path (scheduler_svc.api.validation), so that HTTP and
gRPC refuse the same values with the same words, and declared here (`declared`) so
that the OpenAPI document is as strict as that path. Integers are bounded by the proto
types they become, so that none overflows in translation. Beside OpenAI's fields
are those vLLM takes (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
priority, stop_token_ids). Unknown fields are ignored, as vLLM and OpenAI do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt

from common.sampling_params import (
    MAX_LOGPROBS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
)
from scheduler_svc.api.tokenizer import CHAT_ROLES

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _whole_number(value: Any) -> Any:
    # JSON has one number type: 3.0 is the integer 3 to JSON Schema (and so to the
    # OpenAPI document), and some clients' encoders write it so. 3.5, "3" and true are not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def json_int(low: int, high: int) -> Any:
    """An integer in [low, high], 3.0 read as 3 (the bounds before the validator, so
    that the JSON schema gets them as minimum and maximum)."""
    return Annotated[StrictInt, Field(ge=low, le=high), BeforeValidator(_whole_number)]


Int32 = json_int(INT32_MIN, INT32_MAX)
TokenId = json_int(0, 2**32 - 1)
Seed = json_int(0, 2**64 - 1)
# Each choice is one request in the scheduler; a bound keeps one call from flooding it.
MAX_CHOICES = 16
# OpenAI's default for /v1/completions (chat has none: the scheduler's default applies).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def declared(default: Any = None, place: Callable[[dict], None] | None = None, **by_type) -> Any:
    """A field whose range the one request path checks, declared in the OpenAPI document
    but not enforced by pydantic: by_type maps a JSON type ("number", "integer",
    "string", "array") to the keywords its branch of the field's schema gets (a null
    branch stays as it is); place edits the field's schema itself."""

    def edit(schema: dict) -> None:
        for branch in schema.get("anyOf", [schema]):
            branch.update(by_type.get(branch.get("type"), {}))
        if place is not None:
            place(schema)

    return Field(default, json_schema_extra=edit)


def _closed(low: float, high: float) -> dict:
    return {"number": {"minimum": low, "maximum": high}}


LOGPROBS_RANGE = {"integer": {"minimum": 0, "maximum": MAX_LOGPROBS}}
STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False


class JsonSchemaFormat(BaseModel):
    """response_format's json_schema: OpenAI's {"name", "schema", "strict"}."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str | None = None
    description: str | None = None
    # "schema" would shadow a BaseModel attribute.
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    # Always enforced: the constraint is exact whatever strict says.
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` extra field: exactly one of these."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_value: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None


class SamplingFields(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(extra="ignore")

    # A scheduler serves one model; the name a client sends is not checked.
    model: str | None = None
    max_tokens: Int32 | None = declared(integer={"minimum": 1})
    temperature: float | None = declared(**_closed(0.0, MAX_TEMPERATURE))
    top_p: float | None = declared(number={"exclusiveMinimum": 0.0, "maximum": 1.0})
    n: json_int(1, MAX_CHOICES) = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = declared(
        string=STOP_STRING, array={"maxItems": MAX_STOP_STRINGS, "items": STOP_STRING}
    )
    seed: Seed | None = None
    presence_penalty: float | None = declared(**_closed(-2.0, 2.0))
    frequency_penalty: float | None = declared(**_closed(-2.0, 2.0))
    user: str | None = None
    # vLLM's extra sampling fields.
    # -1 or 0: off.
    top_k: Int32 | None = declared(integer={"minimum": -1})
    min_p: float | None = declared(**_closed(0.0, 1.0))
    repetition_penalty: float | None = declared(number={"exclusiveMinimum": 0.0, "maximum": 2.0})
    # At most max_tokens.
    min_tokens: Int32 = declared(0, integer={"minimum": 0})
    ignore_eos: StrictBool = False
    priority: Int32 = 0
    stop_token_ids: list[TokenId] | None = declared(array={"maxItems": MAX_STOP_TOKEN_IDS})
    # Structured outputs: OpenAI's response_format, or vLLM's structured_outputs.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    # A JSON text, as OpenAI sends it.
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # Checked against the template's roles (tokenizer.CHAT_ROLES) on the request path.
    role: str = declared(..., string={"enum": list(CHAT_ROLES)})
    # A string, or text parts (joined); None for an assistant turn without text.
    content: str | list[TextPart] | None = None
    name: str | None = None
    # An assistant turn's calls, and a tool turn's answer to one.
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(part.text for part in self.content)
        # Earlier calls are shown to the model as it was asked to write them.
        calls = [
            f'{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}'
            for call in self.tool_calls or ()
        ]
        return "\n".join([text, *calls]) if text and calls else text or "\n".join(calls)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: NamedFunction


# What the request path refuses across fields, said in the document as JSON Schema's if/then.
_NEEDS = [
    {  # A tool_choice other than "none" needs tools (tools.tool_plan).
        "if": {
            "required": ["tool_choice"],
            "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}},
        },
        "then": {"required": ["tools"], "properties": {"tools": {"minItems": 1}}},
    },
    {  # top_logprobs above 0 needs logprobs: true (translate.chat_top_logprobs).
        "if": {
            "required": ["top_logprobs"],
            "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
        },
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
    },
]


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="ignore", json_schema_extra={"allOf": _NEEDS})

    messages: list[ChatMessage] = declared(..., array={"minItems": 1})
    max_completion_tokens: Int32 | None = declared(integer={"minimum": 1})
    logprobs: StrictBool = False
    # Needs logprobs: true.
    top_logprobs: Int32 | None = declared(**LOGPROBS_RANGE)
    tools: list[Tool] | None = None
    # Default: "auto" when tools are given, else "none".
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


# A string, several strings, one list of token ids, or several.
Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]


def _non_empty_prompts(schema: dict) -> None:
    """No empty prompt: not the text, the list, a text in it, or a list of ids in it."""
    for branch in schema["anyOf"]:
        if branch["type"] == "string":
            branch["minLength"] = 1
            continue
        branch["minItems"] = 1
        items = branch["items"]
        items.update({"minLength": 1} if items.get("type") == "string" else {})
        items.update({"minItems": 1} if items.get("type") == "array" else {})


class CompletionRequest(SamplingFields):
    prompt: Prompt = declared(..., place=_non_empty_prompts)
    # 0 only with echo (the prompt scored alone).
    max_tokens: Int32 | None = declared(COMPLETIONS_DEFAULT_MAX_TOKENS, integer={"minimum": 0})
    # The top logprobs per token; 0 gives the sampled token's logprob alone.
    logprobs: Int32 | None = declared(**LOGPROBS_RANGE)
    # The prompt before the text (and, with logprobs, its tokens scored before the
    # completion's); with max_tokens 0, the prompt alone.
    echo: StrictBool = False
    # vLLM's: choices[].prompt_logprobs with this many alternatives per prompt token.
    prompt_logprobs: Int32 | None = declared(**LOGPROBS_RANGE)
