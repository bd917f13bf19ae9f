"""Start and stop steps that the scheduler process and its API processes share."""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

import structlog

from common.errors import StartupError
from scheduler_svc.config.edge import EdgeConfig
from scheduler_svc.config.process import ProcessConfig
from scheduler_svc.workers.discovery import WorkerDiscovery, dns_resolver, hosts_file_resolver
from scheduler_svc.workers.pool import WorkerPool

if TYPE_CHECKING:
    from scheduler_svc.api.http.serve import HttpFront

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
    # Imported here: fastapi and uvicorn are about 40% of the scheduler's imports, and
    # a scheduler without --http-port (the tests' stacks, the split core) needs neither.
    from scheduler_svc.api.http.serve import HttpFront

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


def start_discovery(process: ProcessConfig, pool: WorkerPool) -> WorkerDiscovery | None:
    """Follows --worker-dns, when given."""
    if not process.worker_dns:
        return None
    hosts_file = process.worker_hosts_file
    resolver = hosts_file_resolver(hosts_file) if hosts_file else dns_resolver
    discovery = WorkerDiscovery(process.worker_dns, pool, process.worker_dns_interval_s, resolver)
    discovery.start()
    return discovery


def ready_line(
    process: ProcessConfig,
    pool: WorkerPool,
    metrics_port: int | None,
    http_port: int | None,
    api_processes: int = 0,
) -> str:
    """The one stdout line that says the scheduler serves (launchers wait for it)."""
    engines = pool.connected_engines()
    parts = [f"scheduler ready on {process.host}:{process.port}"]
    if process.worker:
        parts.append(f"workers={','.join(process.worker)}")
    if process.prefill_worker:
        parts.append(f"prefill_workers={','.join(process.prefill_worker)}")
    if process.worker_dns:
        parts.append(f"worker_dns={process.worker_dns}")
    if engines:
        parts.append(f"model={engines[0].client.description.model_name}")
    parts.append(f"kv_capacity_tokens={sum(engine.capacity_tokens for engine in engines)}")
    if metrics_port:
        parts.append(f"metrics_port={metrics_port}")
    if http_port:
        parts.append(f"http_port={http_port}")
    if api_processes:
        parts.append(f"api_processes={api_processes}")
    return " ".join(parts)
