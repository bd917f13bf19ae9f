"""The API key check on the scheduler's gRPC door.

Only cbserve.v1.Generation and cbserve.v1.AdminService are locked: grpc.health.v1
and reflection stay open, so that load balancers, Kubernetes probes and `grpcurl list`
work without a key (they say nothing about the model and cost nothing). The key
travels as the call metadata `authorization: Bearer KEY`, the same value as HTTP's
header (ApiKeys).

A refused call never reaches the servicer: the interceptor hands grpc a handler of
the method's own kind (unary or server-streaming) that only aborts with
UNAUTHENTICATED, so no request is validated, queued or logged as accepted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import structlog

from cbserve.v1 import admin_pb2 as apb
from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.api_keys import MISSING_KEY, ApiKeys

log = structlog.get_logger("scheduler.auth")

AUTHORIZATION = "authorization"
# Generation, and AdminService (cbserve drain): an operation is no less guarded.
LOCKED_PREFIXES = (
    "/" + pb.DESCRIPTOR.services_by_name["Generation"].full_name + "/",
    "/" + apb.DESCRIPTOR.services_by_name["AdminService"].full_name + "/",
)
# What a gRPC caller without a key should do; HTTP's wording names the header instead.
GRPC_KEY_HINT = (
    " (gRPC: the call metadata `authorization: Bearer <key>`; cbserve.Client(api_key=...), "
    "`cbserve generate --api-key` or CBSERVE_API_KEY)"
)


def authorization_of(metadata) -> str | None:
    """The first `authorization` value of a call's metadata (keys arrive lower-cased)."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            return value.decode() if isinstance(value, bytes) else value
    return None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(LOCKED_PREFIXES):
            return handler
        refusal = self.keys.refusal(authorization_of(handler_call_details.invocation_metadata))
        if refusal is None:
            return handler
        log.info("call refused", method=handler_call_details.method, reason=refusal)
        if refusal == MISSING_KEY:
            refusal += GRPC_KEY_HINT
        return _refusing(handler, refusal)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler shaped like `handler` (so grpc reads the request as the method
    declares it) that aborts every call with UNAUTHENTICATED."""

    async def refuse(request_or_iterator, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def interceptors_for(api_keys: list[str]) -> list[grpc.aio.ServerInterceptor]:
    """The scheduler server's interceptors: the key check when keys are configured."""
    return [ApiKeyInterceptor(ApiKeys(api_keys))] if api_keys else []
