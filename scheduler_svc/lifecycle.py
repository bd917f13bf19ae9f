"""Start and stop steps that the scheduler process and its API processes share."""

from __future__ import annotations

import asyncio
import signal

import structlog

from common.errors import StartupError
from scheduler_svc.api.http.serve import HttpFront
from scheduler_svc.config import EdgeConfig

log = structlog.get_logger("scheduler_svc")

# Each shutdown stage after the drain gets this long (see bounded_stage).
SHUTDOWN_STAGE_TIMEOUT_S = 10.0


async def bounded_stage(name: str, stage) -> None:
    """One step of the shutdown after the drain, bounded: a SIGTERMed scheduler
    must exit even if a peer never answers a close (a hung worker's channel, an
    idle scrape connection); the stage that ran over is logged."""
    try:
        await asyncio.wait_for(stage, SHUTDOWN_STAGE_TIMEOUT_S)
    except asyncio.TimeoutError:
        log.warning("shutdown stage timed out", stage=name, timeout_s=SHUTDOWN_STAGE_TIMEOUT_S)


async def start_http(
    service, edge: EdgeConfig, host: str, grpc_server, reuse_port: bool = False
) -> HttpFront | None:
    """The OpenAI-compatible HTTP front, when --http-port is set (scheduler_svc/api/http)."""
    if not edge.http_port:
        return None
    front = HttpFront(service, edge, host, reuse_port=reuse_port)
    try:
        await front.start()
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        await grpc_server.stop(grace=None)
        reason = getattr(error, "strerror", None) or str(error)
        raise StartupError(f"http port {edge.http_port}: {reason}") from error
    return front


def stop_event() -> asyncio.Event:
    """Set by SIGINT or SIGTERM: the graceful shutdown's start."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop
