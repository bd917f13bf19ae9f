"""cbserve.v1.AdminService: operations on a running scheduler (`cbserve drain`).

Served on the scheduler's gRPC port beside Generation, so the server's interceptors
(API keys, grpc_auth.py) guard it as they guard Generation: with --api-key set, a
call without a valid key is refused UNAUTHENTICATED before it reaches here.

With --api-processes N the gRPC port is the API processes': their pool (a view of the
core's, split/remote_pool.py) forwards the drain to the core, whose pool does it.
"""

from __future__ import annotations

import grpc
import structlog

from cbserve.v1 import admin_pb2 as apb
from cbserve.v1 import admin_pb2_grpc as apb_grpc
from common.errors import ServiceError

log = structlog.get_logger("scheduler.admin")

SERVICE_NAME = apb.DESCRIPTOR.services_by_name["AdminService"].full_name


class AdminService(apb_grpc.AdminServiceServicer):
    def __init__(self, pool) -> None:  # WorkerPool, or an API process's RemotePool
        self.pool = pool

    async def DrainWorker(  # noqa: N802 (gRPC method name)
        self, request: apb.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> apb.DrainWorkerResponse:
        if not request.address:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "address is required")
        log.info("draining a worker", worker=request.address)
        try:
            counts = await self.pool.drain(request.address)
        except ServiceError as error:
            await context.abort(error.code, error.message)
        return apb.DrainWorkerResponse(
            requests_moved=counts.requests_moved,
            requests_recomputed=counts.requests_recomputed,
            requests_requeued=counts.requests_requeued,
            blocks_moved=counts.blocks_moved,
            bytes_moved=counts.bytes_moved,
            tokens_not_recomputed=counts.tokens_not_recomputed,
            seconds=counts.seconds,
        )


def add_admin_to_server(pool, server: grpc.aio.Server) -> None:
    apb_grpc.add_AdminServiceServicer_to_server(AdminService(pool), server)
