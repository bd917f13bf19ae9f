"""The worker process: binds its port, loads the model, serves until a signal.

The port is bound before the model loads, so that a taken port fails in a second.
Beside the Worker service (servicer.py) it serves grpc.health.v1 (NOT_SERVING
while the model loads), reflection, and, when asked, /metrics.

On SIGTERM the worker drains: health NOT_SERVING, new streams refused with
UNAVAILABLE, and the open stream gets --grace-period seconds to be closed by
its scheduler; past that it ends with UNAVAILABLE after the step in flight.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from cbserve.worker.v1 import worker_pb2_grpc
from common.errors import StartupError
from common.grpc_server import PortUnavailable, create_server, enable_reflection, set_serving
from common.logging import announce_ready
from common.metrics_server import MetricsServer
from worker_svc.config import DEFAULT_GRACE_PERIOD_S, WorkerConfig
from worker_svc.metrics import WorkerMetrics
from worker_svc.servicer import SERVICE_NAME, WorkerServicer

if TYPE_CHECKING:
    from worker_svc.worker import Worker

log = structlog.get_logger("worker_svc.server")


def ready_line(
    config: WorkerConfig, port: int, worker: Worker, metrics_port: int | None = None
) -> str:
    d = worker.description
    return (
        f"worker ready on {config.host}:{port} model={d.model_name} dtype={d.dtype} "
        f"model_impl={d.model_impl} device={d.device} processor={d.processor!r} "
        f"threads={worker.threads} kv_blocks={d.num_kv_blocks} block_size={d.block_size} "
        f"backend={d.attention_backend} kv_cache_dtype={worker.runner.pool.dtype_name}"
        + (" compiled=torch.compile" if config.compile else "")
        + (f" metrics_port={metrics_port}" if metrics_port is not None else "")
    )


async def serve(
    config: WorkerConfig, metrics_port: int = 0, grace_period_s: float = DEFAULT_GRACE_PERIOD_S
) -> None:
    """Bind, load the model, serve until SIGINT/SIGTERM. Raises StartupError.

    metrics_port: serve /metrics there; 0, none.
    grace_period_s: on SIGTERM, how long the open Step stream gets to end.
    """
    # Bound before the model loads, so that a taken port fails in a second;
    # the bound port is the real one under `--port 0`, for the ready line.
    try:
        server, health, port = create_server(config.address, credentials=config.credentials())
    except (PortUnavailable, ValueError) as exc:  # ValueError: a PEM file (common.tls)
        raise StartupError(str(exc)) from None
    # Labelled with the name Describe will report (model_loader: the path's last part),
    # known before the model loads.
    servicer = WorkerServicer(
        WorkerMetrics(model_name=Path(config.model).name), kv_transfer_shm=config.kv_transfer_shm
    )
    metrics_server = None
    if metrics_port:
        metrics_server = MetricsServer(servicer.metrics.registry, config.host, metrics_port)
        try:
            await metrics_server.start()
        except OSError as exc:
            await server.stop(grace=None)
            raise StartupError(f"metrics port {metrics_port}: {exc.strerror}") from None
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    enable_reflection(server, [SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], serving=False)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    await server.start()
    # Imported only now: torch and transformers take seconds to import, and a
    # taken port should fail before that.
    from worker_svc.startup import build_worker

    try:
        loading = loop.run_in_executor(servicer.executor, build_worker, config)
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not loading.done():
            log.info("worker_stopping", during="model load")
            return
        try:
            worker = loading.result()
        except Exception as exc:
            raise StartupError(str(exc)) from exc
        # A null worker's runner has no torch model to watch.
        model = getattr(getattr(worker.runner, "loaded", None), "model", None)
        if model is not None:
            servicer.metrics.watch_experts(model)
        servicer.set_ready(worker)
        await set_serving(health, [SERVICE_NAME], serving=True)
        announce_ready(
            ready_line(config, port, worker, metrics_server.port if metrics_server else None)
        )
        await stop.wait()
        log.info("worker_stopping", grace_period_s=grace_period_s)
        await health.enter_graceful_shutdown()
        await servicer.drain(grace_period_s)
    finally:
        await server.stop(grace=1.0)
        if metrics_server is not None:
            await metrics_server.stop()
        servicer.executor.shutdown(wait=False, cancel_futures=True)


def run(
    config: WorkerConfig, metrics_port: int = 0, grace_period_s: float = DEFAULT_GRACE_PERIOD_S
) -> int:
    import uvloop

    try:
        uvloop.run(serve(config, metrics_port, grace_period_s))
    except StartupError as exc:
        print(f"worker_svc: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
