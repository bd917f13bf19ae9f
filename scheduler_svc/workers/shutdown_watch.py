"""A worker's graceful shutdown as the scheduler sees it, so that it can be drained.

On SIGTERM a worker turns its grpc.health.v1 status NOT_SERVING, refuses new Step
streams and gives the open one its --grace-period to be closed (worker_svc/server.py,
servicer.py); its other RPCs, SendKv among them, are still answered. The scheduler
watches that status on the channel it already holds (health.v1 Watch): NOT_SERVING
after SERVING while connected means the worker is leaving, and the pool drains it then
(workers/drain.py: its requests moved with their KV), instead of recomputing them once
the grace period has ended the stream. A watch that breaks (the worker died, the
channel closed) ends quietly: a lost worker is liveness.py's to find.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cbserve.worker.v1 import worker_pb2 as wpb

log = structlog.get_logger("scheduler.shutdown_watch")

WORKER_SERVICE = wpb.DESCRIPTOR.services_by_name["Worker"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING


async def watch_for_shutdown(
    channel: grpc.aio.Channel, address: str, on_shutdown: Callable[[], None]
) -> None:
    """Calls on_shutdown once the worker behind channel turns NOT_SERVING after it
    served; returns then, or when the watch breaks."""
    stub = health_pb2_grpc.HealthStub(channel)
    served = False
    try:
        async for reply in stub.Watch(health_pb2.HealthCheckRequest(service=WORKER_SERVICE)):
            if reply.status == SERVING:
                served = True
            elif served:
                log.info("worker is shutting down; draining it", worker=address)
                on_shutdown()
                return
    except grpc.aio.AioRpcError as error:
        if error.code() is not grpc.StatusCode.CANCELLED:
            log.debug("health watch ended", worker=address, code=error.code().name)


def start_watch(
    channel: grpc.aio.Channel | None, address: str, on_shutdown: Callable[[], None]
) -> asyncio.Task | None:
    if channel is None:
        return None
    return asyncio.create_task(
        watch_for_shutdown(channel, address, on_shutdown), name=f"health watch {address}"
    )
