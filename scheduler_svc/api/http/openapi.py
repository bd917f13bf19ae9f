"""The front's /openapi.json: FastAPI's document, corrected to say what the routes answer.

FastAPI declares a 422 for every route with a body, but this front answers a body it
cannot read with a 400 in OpenAI's error shape (errors.py): the 422 and its schemas
go. What FastAPI cannot know is added: `text/event-stream` beside JSON where a route
streams (responses.answers), Prometheus' text formats for /metrics, the bearer key
where one is configured, the `Allow` header of the 405 any route answers to a
method it does not serve (RFC 9110; errors.py sends it), and errors as JSON on a route
whose success is plain text (the LoRA routes).

Client generators and gateways read this document; tests/http_front fuzz the live
front from it with schemathesis.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from scheduler_svc.api.http.responses import SSE

# What /metrics answers: Prometheus' text format, or OpenMetrics when the scraper's
# Accept header asks for it (prometheus_client's negotiation).
METRICS_MEDIA_TYPES = (
    "text/plain; version=0.0.4; charset=utf-8",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
)
_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
# One server-sent event of a stream, as a client parses it: its `data` is a chunk (or,
# when a stream fails past its first byte, an OpenAI error object) as JSON, or the
# closing `[DONE]`.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "anyOf": [
                {"const": "[DONE]"},
                {"contentMediaType": "application/json", "contentSchema": {"type": "object"}},
            ],
        },
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}
BEARER_SCHEME = "bearer"


def install_openapi(app: FastAPI, keys_required: bool, open_routes: frozenset[str]) -> None:
    """Makes app.openapi() build the corrected document (once, then cached).
    open_routes: the paths that need no key even when keys are configured."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=_ABOUT
            )
            correct(document, keys_required, open_routes)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = build


_ABOUT = (
    "OpenAI-compatible HTTP front of cbserve's scheduler. Errors are answered in "
    'OpenAI\'s shape, `{"error": {"message", "type", "param", "code"}}`; a method a '
    "route does not serve is answered 405 with an `Allow` header."
)


def _errors_as_json(response: dict[str, Any]) -> None:
    """An error is answered as JSON whatever the route's own media type (errors.py); FastAPI
    declares it under the route's (text/plain for the LoRA routes' plain-text success)."""
    media = response.get("content", {})
    schemas = [entry["schema"] for entry in media.values() if "schema" in entry]
    if schemas:
        response["content"] = {"application/json": {"schema": schemas[0]}}


def correct(document: dict[str, Any], keys_required: bool, open_routes: frozenset[str]) -> None:
    for path, operations in document["paths"].items():
        for operation in operations.values():
            responses = operation["responses"]
            responses.pop("422", None)
            for status, response in responses.items():
                if response.pop("x-cbserve-streams", False):
                    response["content"][SSE] = {"schema": SSE_EVENT_SCHEMA}
                if status.isdigit() and int(status) >= 400:
                    _errors_as_json(response)
            if path == "/metrics":
                responses["200"]["content"] = {
                    media_type: {"schema": {"type": "string"}} for media_type in METRICS_MEDIA_TYPES
                }
            if keys_required and path not in open_routes:
                operation["security"] = [{BEARER_SCHEME: []}]
            elif not keys_required:
                # Keys are off: a route never answers 401, so it does not say it might.
                responses.pop("401", None)
    schemas = document.get("components", {}).get("schemas", {})
    for name in _FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    if keys_required:
        document.setdefault("components", {})["securitySchemes"] = {
            BEARER_SCHEME: {"type": "http", "scheme": "bearer"}
        }
