"""What each route answers, as the OpenAPI document declares it (app.py passes these
to the route decorators; openapi.py finishes the document).

These models describe bodies the shapers (chat.py, completions.py, render.py, ...)
build as plain dicts; they are never used to build or check a response at run time,
so they cost a request nothing. Each names the fields every answer has (required)
and leaves room for the rest (extra fields allowed), so that a client generator
gets the real shape and a gateway reading the document is never told a lie.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    # Answers may carry fields beyond those named here (OpenAI adds some over time).
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Open):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(_Open):
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorDetail


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(_Open):
    index: int
    message: dict[str, Any]
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class Completion(_Open):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class RenderedRequest(_Open):
    """vLLM's GenerateRequest shape: the token ids a request would run with."""

    request_id: str
    token_ids: list[int]
    sampling_params: dict[str, Any]
    model: str
    stream: bool
    priority: int


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    # The model's directory (an adapter's: its PEFT directory).
    root: str | None = None
    # A LoRA adapter's base model (vLLM's field); absent for the base itself.
    parent: str | None = None


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Open):
    workers_connected: int


class Version(_Open):
    version: str


class TokenizeResponse(_Open):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(_Open):
    prompt: str


# Why each status is answered, in the words a client reads in the document.
_WHY = {
    400: "The body is malformed or a value is out of range (`error.param` names the field).",
    401: "An API key is configured and the `Authorization: Bearer` header lacks it.",
    404: "The `model` names neither the served model nor a loaded LoRA adapter "
    "(with `--enable-lora`; `error.code` is `model_not_found`).",
    409: "The `X-Request-Id` header names a request still in flight.",
    429: "The queue or the stream limit is full; retry later with backoff.",
    503: "No worker is connected, or the server is draining; retry shortly.",
    504: "The request's deadline passed before it finished.",
}
SSE = "text/event-stream"


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` entries of these error statuses, each with OpenAI's error body."""
    return {status: {"model": ErrorResponse, "description": _WHY[status]} for status in statuses}


def answers(model: type[BaseModel], *statuses: int, streams: bool = False) -> dict:
    """A route's `responses`: its 200 body and its error statuses. A route that streams
    also answers `text/event-stream` (openapi.py adds that media type, since FastAPI
    declares only JSON for a model)."""
    ok: dict[str, Any] = {"model": model, "description": "The answer."}
    if streams:
        ok["description"] = (
            "The answer; with `stream: true`, server-sent events of chunks, ending in "
            "`data: [DONE]`."
        )
        ok["x-cbserve-streams"] = True
    return {200: ok, **errors(*statuses)}


# The statuses the request path can answer (errors.HTTP_STATUS of what it raises);
# with LoRA on, an unknown `model` is 404 too (http/adapters.py).
GENERATION_ERRORS = (400, 401, 409, 429, 503, 504)
LORA_GENERATION_ERRORS = (*GENERATION_ERRORS, 404)
RENDER_ERRORS = (400, 401, 503)
# /health answers its body with either status, so that a probe reads why.
HEALTH_ANSWERS = {
    200: {"model": Health, "description": "A worker is connected."},
    503: {"model": Health, "description": "No worker is connected, or the server is draining."},
}
