"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

A refusal from the one request path (a ServiceError with its gRPC status) gets the
HTTP status that means the same; a body FastAPI cannot read (malformed JSON, a
field of the wrong type) is a 400 naming the field. Bad input is never a 500.
"""

from __future__ import annotations

import json

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from common.errors import ServiceError

log = structlog.get_logger("scheduler.http")

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    # A request_id already in flight: the client's X-Request-Id clashes with another.
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class OpenAIError(Exception):
    """An error answered in OpenAI's shape with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def sse(self) -> str:
        """The error as one server-sent event, for a stream whose status is already sent."""
        return f"data: {json.dumps(self.body())}\n\n"


def openai_param(field: str | None) -> str | None:
    """A GenerateRequest field path as the OpenAI field a client sent."""
    if not field:
        return None
    for proto, openai in (("sampling.", ""), ("chat.messages", "messages"), ("chat", "messages")):
        if field.startswith(proto):
            return openai + field[len(proto) :]
    if field.startswith("prompt_token_ids"):
        return "prompt"
    return field


def from_service_error(error: ServiceError) -> OpenAIError:
    return OpenAIError(
        HTTP_STATUS.get(error.code, 500),
        error.message,
        openai_param(getattr(error, "field", None)),
        error.code.name.lower(),
    )


_UNION_MEMBERS = {"str", "int", "float", "bool", "none"}


def _location(loc: tuple) -> str | None:
    """FastAPI's error location ("body", "messages", 0, "content") as messages[0].content."""
    parts = [part for part in loc if part != "body"]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in _UNION_MEMBERS or "[" in part or "-" in part:
            # A union member's tag (str, list[int], function-after[...]): not a field.
            continue
        else:
            text += f".{part}" if text else str(part)
    return text or None


def from_validation_error(error: RequestValidationError) -> OpenAIError:
    first = error.errors()[0] if error.errors() else {}
    kind = first.get("type", "invalid")
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return OpenAIError(400, f"the body is not valid JSON: {detail}".strip(), None, kind)
    param = _location(tuple(first.get("loc", ())))
    where = f"{param}: " if param else "the body: "
    return OpenAIError(400, where + first.get("msg", "invalid"), param, kind)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_request: Request, error: OpenAIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(ServiceError)
    async def _service(_request: Request, error: ServiceError) -> JSONResponse:
        return from_service_error(error).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        return from_validation_error(error).response()

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, error: HTTPException) -> JSONResponse:
        # Starlette's own headers kept: a 405's `Allow` lists the route's methods (RFC 9110).
        return OpenAIError(error.status_code, str(error.detail)).response(error.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> JSONResponse:
        # A bug on this side, not the client's input: logged with its traceback.
        log.exception("http handler failed", error=repr(error))
        return OpenAIError(500, "internal error; see the scheduler's log").response()
