"""The request bodies of /v1/chat/completions and /v1/completions, in OpenAI's field names.

Only the types are checked here (a wrong type is a 400 naming the field); the ranges
are checked by the one request path (scheduler_svc.api.validation), so that HTTP and
gRPC refuse the same values with the same words. Integers are bounded by the proto
types they become, so that none overflows in translation. Beside OpenAI's fields
are those vLLM takes (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
priority, stop_token_ids). Unknown fields are ignored, as vLLM and OpenAI do.
"""

from __future__ import annotations

from typing import Annotated, Literal

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

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    # A string, or text parts (joined); None for an assistant turn without text.
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: Int32 | None = None
    logprobs: StrictBool = False
    top_logprobs: Int32 | None = None


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
