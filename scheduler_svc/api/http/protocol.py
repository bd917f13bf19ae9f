"""The request bodies of /v1/chat/completions and /v1/completions, in OpenAI's field names.

Only the types are checked here (a wrong type is a 400 naming the field); the ranges
are checked by the one request path (scheduler_svc.api.validation), so that HTTP and
gRPC refuse the same values with the same words. Integers are bounded by the proto
types they become, so that none overflows in translation. Beside OpenAI's fields
are those vLLM takes (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
priority, stop_token_ids). Unknown fields are ignored, as vLLM and OpenAI do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
Int32 = Annotated[StrictInt, Field(ge=INT32_MIN, le=INT32_MAX)]
TokenId = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
Seed = Annotated[StrictInt, Field(ge=0, le=2**64 - 1)]
# Each choice is one request in the scheduler; a bound keeps one call from flooding it.
MAX_CHOICES = 16
# OpenAI's default for /v1/completions (chat has none: the scheduler's default applies).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


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
    max_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # vLLM's extra sampling fields.
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int32 = 0
    ignore_eos: StrictBool = False
    priority: Int32 = 0
    stop_token_ids: list[TokenId] | None = None
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

    role: str
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


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: Int32 | None = None
    logprobs: StrictBool = False
    top_logprobs: Int32 | None = None
    tools: list[Tool] | None = None
    # Default: "auto" when tools are given, else "none".
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


# A string, several strings, one list of token ids, or several.
Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: Int32 | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    # The top logprobs per token; 0 gives the sampled token's logprob alone.
    logprobs: Int32 | None = None
    # The prompt before the text (and, with logprobs, its tokens scored before the
    # completion's); with max_tokens 0, the prompt alone.
    echo: StrictBool = False
    # vLLM's: choices[].prompt_logprobs with this many alternatives per prompt token.
    prompt_logprobs: Int32 | None = None
