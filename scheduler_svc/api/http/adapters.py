"""LoRA adapters on the HTTP front, with vLLM's contract.

- The `model` field of chat and completions: the served model's name (or none) is the
  base; an adapter's name generates with that adapter (GenerateRequest.lora_name), and
  the response's `model` is the adapter's name. With LoRA on (`--enable-lora`) any other
  name is 404 in OpenAI's error shape (`NotFoundError` in the openai client); with it
  off the field is not checked, as before adapters existed.
- `POST /v1/load_lora_adapter` {"lora_name", "lora_path"} and `POST
  /v1/unload_lora_adapter` {"lora_name"}: answered 200 with vLLM's plain-text
  "Success: ..." line. They exist only with LoRA on (404 otherwise, as vLLM's routes
  exist only when runtime loading is allowed). A load the registry refuses (a name
  already loaded, a rank over --max-lora-rank, not a LoRA directory) is 400; a
  directory that does not exist, or an unload of a name not loaded, is 404.
- `/v1/models`: the base first, then each adapter with `parent` (its base model's
  name) and `root` (its directory), as vLLM lists them.

The scheduler owns the adapters (scheduler_svc/lora/registry.py); this module only
translates. A ServiceError from the pool keeps its meaning (errors.py), except that
ALREADY_EXISTS, which the front otherwise answers 409 for a request id in flight, is
vLLM's 400 here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from common.errors import ServiceError
from scheduler_svc.api.http.errors import OpenAIError, from_service_error
from scheduler_svc.api.http.responses import errors
from scheduler_svc.api.http.translate import Choice
from scheduler_svc.api.pool_view import PoolView

MODEL_NOT_FOUND = "model_not_found"


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's body; fields it has beyond these (load_inplace, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, description="the name requests give as `model`")
    lora_path: str = Field(
        min_length=1, description="a PEFT LoRA directory on the scheduler's and workers' disk"
    )


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)


def lora_name_for(model: str | None, served_name: str, pool: PoolView) -> str:
    """The adapter a request's `model` names ("" for the base); OpenAIError 404 for a
    name that is neither the served model nor a loaded adapter, with LoRA on."""
    if not pool.lora_enabled or not model or model == served_name:
        return ""
    if any(adapter.name == model for adapter in pool.adapters()):
        return model
    raise OpenAIError(
        404,
        f"the model `{model}` does not exist: this server serves `{served_name}` and the "
        "LoRA adapters GET /v1/models lists",
        "model",
        MODEL_NOT_FOUND,
    )


def name_adapter(choices: Iterable[Choice], lora_name: str) -> None:
    """Every choice's request generates with the adapter (or the base, for "")."""
    for choice in choices:
        choice.request.lora_name = lora_name


def adapter_cards(pool: PoolView, created: int, max_model_len: int) -> list[dict[str, Any]]:
    """/v1/models entries of the loaded adapters, after the base's."""
    if not pool.lora_enabled:
        return []
    return [
        {
            "id": adapter.name,
            "object": "model",
            "created": created,
            "owned_by": "cbserve",
            "root": adapter.path,
            "parent": adapter.base_model_name,
            "max_model_len": max_model_len,
        }
        for adapter in pool.adapters()
    ]


def _refusal(error: ServiceError) -> OpenAIError:
    refused = from_service_error(error)
    if error.code == grpc.StatusCode.ALREADY_EXISTS:
        refused.status = 400
    return refused


_SUCCESS = {
    "description": "Done, as vLLM answers it: one line of plain text, `Success: ...`.",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}
_LOAD_ANSWERS = {
    200: _SUCCESS,
    **errors(400, 401),
    404: {**errors(404)[404], "description": "The adapter directory does not exist."},
}
_UNLOAD_ANSWERS = {
    200: _SUCCESS,
    **errors(400, 401),
    404: {**errors(404)[404], "description": "No adapter of that name is loaded."},
}


def install_adapter_routes(app: FastAPI, pool: PoolView, keyed: list) -> None:
    """The load and unload routes, with LoRA on only."""
    if not pool.lora_enabled:
        return

    @app.post(
        "/v1/load_lora_adapter",
        dependencies=keyed,
        response_class=PlainTextResponse,
        responses=_LOAD_ANSWERS,
    )
    async def load_lora_adapter(body: LoadLoRAAdapterRequest):
        try:
            adapter = await pool.load_adapter(body.lora_name, body.lora_path, None)
        except ServiceError as error:
            raise _refusal(error) from None
        return PlainTextResponse(f"Success: LoRA adapter '{adapter.name}' added successfully.")

    @app.post(
        "/v1/unload_lora_adapter",
        dependencies=keyed,
        response_class=PlainTextResponse,
        responses=_UNLOAD_ANSWERS,
    )
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
        try:
            await pool.unload_adapter(body.lora_name)
        except ServiceError as error:
            raise _refusal(error) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
