"""The routes of the OpenAI-compatible front.

POST /v1/chat/completions and /v1/completions translate the body (translate.py), run
its choices through GenerationService.generate (fan_out.py) and shape the answer
(chat.py, completions.py); their /render routes answer the token ids instead
(render.py); POST /tokenize and /detokenize answer the tokenizer's (tokenize.py).
GET /v1/models, /health, /metrics and /version describe the server; with API keys
configured every route but the last three needs `Authorization: Bearer KEY`. With
--enable-lora, `model` may name a LoRA adapter, and POST /v1/load_lora_adapter and
/v1/unload_lora_adapter change which are served (adapters.py). What each route
answers is declared in /openapi.json (responses.py, openapi.py).

A request's id is the client's X-Request-Id header or a new one; it is the response's
`id` (chatcmpl-<id>, cmpl-<id>), its X-Request-Id header, and the request_id of the
request's log lines.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from scheduler_svc.api import admission
from scheduler_svc.api.api_keys import ApiKeys
from scheduler_svc.api.http.adapters import (
    adapter_cards,
    install_adapter_routes,
    lora_name_for,
    name_adapter,
)
from scheduler_svc.api.http.chat import ChatShaper
from scheduler_svc.api.http.completions import CompletionShaper
from scheduler_svc.api.http.errors import OpenAIError, install_handlers
from scheduler_svc.api.http.fan_out import FanOut
from scheduler_svc.api.http.openapi import install_openapi
from scheduler_svc.api.http.protocol import ChatCompletionRequest, CompletionRequest
from scheduler_svc.api.http.render import render
from scheduler_svc.api.http.responses import (
    GENERATION_ERRORS,
    HEALTH_ANSWERS,
    LORA_GENERATION_ERRORS,
    RENDER_ERRORS,
    ChatCompletion,
    Completion,
    DetokenizeResponse,
    ModelList,
    RenderedRequest,
    TokenizeResponse,
    Version,
    answers,
)
from scheduler_svc.api.http.shaping import Shaper
from scheduler_svc.api.http.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from scheduler_svc.api.http.tools import tool_plan
from scheduler_svc.api.http.translate import (
    chat_requests,
    chat_top_logprobs,
    completion_requests,
    scores_prompt_only,
)
from scheduler_svc.api.server import GenerationService

REQUEST_ID_HEADER = "X-Request-Id"
STARTED = int(time.time())
# The routes that need no API key: probes and scrapers carry none.
OPEN_ROUTES = frozenset({"/health", "/metrics", "/version"})


def _version() -> str:
    try:
        return importlib.metadata.version("cbserve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _request_id(request: Request) -> str:
    # Checked (length) on the one request path, like a gRPC request_id.
    return request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex


# nginx's status for "the client closed the connection": logged, never seen by anyone.
CLIENT_GONE = 499
_GONE = object()


async def _unless_disconnected(request: Request, work, fan_out: FanOut):
    """Awaits work, unless the client disconnects first: then the choices are cancelled
    (their requests aborted) and _GONE is returned."""
    work_task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        # The body is read already: the next message is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work_task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work_task.done():
            work_task.cancel()
            fan_out.cancel()
    if not work_task.done():
        return _GONE
    return work_task.result()


def create_app(service: GenerationService, api_keys: ApiKeys) -> FastAPI:
    """The FastAPI app over the scheduler's service and metrics registry."""
    app = FastAPI(title="cbserve", version=_version(), docs_url=None, redoc_url=None)
    install_handlers(app)
    install_openapi(app, api_keys.required, OPEN_ROUTES)
    pool, tokenizer = service.pool, service.tokenizer

    def require_key(request: Request) -> None:
        refusal = api_keys.refusal(request.headers.get("authorization"))
        if refusal is not None:
            raise OpenAIError(401, refusal, None, "invalid_api_key")

    def model_name() -> str:
        engines = pool.connected_engines()
        return engines[0].client.description.model_name if engines else tokenizer.name

    async def respond(request: Request, stream: bool, fan_out: FanOut, shaper: Shaper):
        headers = {REQUEST_ID_HEADER: shaper.id.removeprefix(shaper.id_prefix)}
        if stream:
            # Refusals (bad input, overload, no worker) get their status before the stream.
            if await _unless_disconnected(request, fan_out.first(), fan_out) is _GONE:
                return Response(status_code=CLIENT_GONE)
            return StreamingResponse(
                shaper.stream(fan_out), media_type="text/event-stream", headers=headers
            )
        collected = await _unless_disconnected(request, fan_out.collect(), fan_out)
        if collected is _GONE:
            return Response(status_code=CLIENT_GONE)
        return JSONResponse(shaper.response(collected), headers=headers)

    keyed = [Depends(require_key)]
    # With LoRA on, `model` names the base or an adapter, and any other name is 404.
    refusals = LORA_GENERATION_ERRORS if pool.lora_enabled else GENERATION_ERRORS
    generates = answers(ChatCompletion, *refusals, streams=True)

    def adapter_of(model: str | None, choices) -> str:
        """The model the response names: the adapter the choices now generate with, or
        the served model."""
        served = model_name()
        lora_name = lora_name_for(model, served, pool)
        name_adapter(choices, lora_name)
        return lora_name or served

    @app.post("/v1/chat/completions", dependencies=keyed, responses=generates)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        request_id = _request_id(request)
        choices = chat_requests(body, request_id)
        shaper = ChatShaper(
            request_id,
            adapter_of(body.model, choices),
            choices,
            tokenizer.id_to_token_text,
            chat_top_logprobs(body),
            body.include_usage,
            tools=tool_plan(body),
        )
        return await respond(request, body.stream, FanOut(service, choices), shaper)

    completes = answers(Completion, *refusals, streams=True)

    @app.post("/v1/completions", dependencies=keyed, responses=completes)
    async def completions(body: CompletionRequest, request: Request):
        request_id = _request_id(request)
        choices = completion_requests(body, request_id)
        shaper = CompletionShaper(
            request_id,
            adapter_of(body.model, choices),
            choices,
            tokenizer.id_to_token_text,
            body.logprobs,
            body.include_usage,
            echo=body.echo,
            prompt_only=scores_prompt_only(body),
            prompt_logprobs=body.prompt_logprobs,
            decode=tokenizer.decode,
        )
        return await respond(request, body.stream, FanOut(service, choices), shaper)

    def limits():
        # The model's limits come from its workers: refused as generation is without one.
        admission.require_a_worker(bool(pool.connected_engines()), pool.accepts_without_worker())
        return service.limits()

    # The token ids a request would run with (vLLM's render routes; render.py).
    @app.post(
        "/v1/chat/completions/render",
        dependencies=keyed,
        responses=answers(RenderedRequest, *RENDER_ERRORS),
    )
    async def chat_completions_render(body: ChatCompletionRequest, request: Request):
        choices = chat_requests(body, _request_id(request))
        [rendered] = render(body, choices, tokenizer, limits(), model_name())
        return rendered

    @app.post(
        "/v1/completions/render",
        dependencies=keyed,
        responses=answers(list[RenderedRequest], *RENDER_ERRORS),
    )
    async def completions_render(body: CompletionRequest, request: Request):
        choices = completion_requests(body, _request_id(request))
        return render(body, choices, tokenizer, limits(), model_name())

    @app.post("/tokenize", dependencies=keyed, responses=answers(TokenizeResponse, *RENDER_ERRORS))
    async def tokenize_route(body: TokenizeRequest):
        return tokenize(body, tokenizer, limits())

    @app.post(
        "/detokenize", dependencies=keyed, responses=answers(DetokenizeResponse, *RENDER_ERRORS)
    )
    async def detokenize_route(body: DetokenizeRequest):
        return detokenize(body, tokenizer, limits())

    @app.get("/v1/models", dependencies=keyed, responses=answers(ModelList, 401, 503))
    async def models():
        if not pool.connected_engines():
            raise OpenAIError(503, "no worker is connected; try again shortly")
        card = {
            "id": model_name(),
            "object": "model",
            "created": STARTED,
            "owned_by": "cbserve",
            "root": tokenizer.name,
            "max_model_len": pool.max_model_len,
        }
        adapters = adapter_cards(pool, STARTED, pool.max_model_len)
        return {"object": "list", "data": [card, *adapters]}

    install_adapter_routes(app, pool, keyed)

    @app.get("/health", responses=HEALTH_ANSWERS)
    async def health():
        # Like the gRPC health status: serving while a worker is connected, and not
        # once shutting down, so that balancers send new clients elsewhere.
        connected = len(pool.connected_engines())
        status = 200 if connected and not service.draining else 503
        return JSONResponse({"workers_connected": connected}, status_code=status)

    @app.get("/metrics")
    async def metrics(request: Request):
        body, content_type = await service.exposition(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    @app.get("/version", responses=answers(Version))
    async def version():
        return {"version": _version()}

    return app
