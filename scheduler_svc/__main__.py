"""python -m scheduler_svc --port 50051 {--worker HOST:PORT ... | --worker-dns NAME:PORT}

Loads the tokenizer, listens (health NOT_SERVING), connects to every --worker
in the background, whether it is not started yet or still loading its model,
and serves cbserve.v1.Generation once one answers (see
workers/startup_watch.py); starts following --worker-dns. Prints one line when
ready; exits non-zero with one clear message when it cannot start (no --worker
ready within --worker-connect-timeout among the reasons).

With --worker-dns the scheduler starts without waiting for any worker: it is
ready (listening) at once, and its health status turns SERVING when the first
worker behind the name connects.

Every flag is a field of one of SCHEDULER_CONFIGS (scheduler_svc/config/), with
the variable CBSERVE_SCHEDULER_<FLAG> as its default (`--help` lists them).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import structlog
import uvloop

from common import parent_watch
from common.defaults import default_model_path
from common.errors import StartupError
from common.grpc_server import PortUnavailable, create_server, enable_reflection, set_serving
from common.logging import announce_ready, configure_logging
from common.metrics_server import MetricsServer
from scheduler_svc.api.admin import SERVICE_NAME as ADMIN_SERVICE_NAME
from scheduler_svc.api.admin import add_admin_to_server
from scheduler_svc.api.server import GenerationService
from scheduler_svc.api.serving_status import follow_workers
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.wire import add_to_server
from scheduler_svc.flags import (
    SERVICE_NAME,
    configs_from_args,
    edge_config_from_args,
    parse_args,
)
from scheduler_svc.grpc_security import grpc_server_security, worker_channel_security
from scheduler_svc.kv_events import open_kv_events
from scheduler_svc.lifecycle import (
    bounded_stage,
    ready_line,
    start_discovery,
    start_http,
    stop_event,
)
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers.pool import NoWorkerReady, WorkerPool

log = structlog.get_logger("scheduler_svc")


async def serve(args: argparse.Namespace) -> None:
    process, config, faults = configs_from_args(args)
    edge = edge_config_from_args(args)
    try:
        # PEM files first: a wrong path fails before the tokenizer loads.
        grpc_credentials, interceptors = grpc_server_security(edge)
        worker_security = worker_channel_security(edge)
        tokenizer = Tokenizer(process.tokenizer or default_model_path())
        server, health, _ = create_server(
            f"{process.host}:{process.port}",
            credentials=grpc_credentials,
            interceptors=interceptors,
        )
    except (ValueError, FileNotFoundError, PortUnavailable) as error:
        raise StartupError(str(error)) from error
    metrics = SchedulerMetrics(model_name=tokenizer.name)
    connect_timeout_s = process.worker_connect_timeout_s
    kv_events = open_kv_events(config.kv_events)
    pool = WorkerPool(
        config,
        tokenizer,
        metrics,
        connect_timeout_s=connect_timeout_s,
        faults=faults,
        worker_security=worker_security,
        kv_events=kv_events.replica if kv_events else None,
    )
    metrics.watch(pool)
    service = GenerationService(
        pool,
        tokenizer,
        config.max_waiting_requests,
        metrics,
        max_concurrent_streams=faults.max_concurrent_streams,
    )
    add_to_server(service, server)
    # cbserve drain: behind the same interceptors (API keys) as Generation.
    add_admin_to_server(pool, server)
    metrics_server = None
    if process.metrics_port:
        metrics_server = MetricsServer(metrics.registry, process.host, process.metrics_port)
        try:
            await metrics_server.start()
        except OSError as error:
            raise StartupError(f"metrics port {process.metrics_port}: {error.strerror}") from error
    enable_reflection(server, [SERVICE_NAME, ADMIN_SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], serving=False)
    await server.start()
    # Before the workers, so that a port taken fails at once, without touching them.
    http_front = await start_http(service, edge, process.host, server)
    try:
        pool.split.add_prefill_workers(process.prefill_worker)
        await pool.start([*process.worker, *process.prefill_worker], connect_timeout_s)
    except NoWorkerReady as error:
        await server.stop(grace=None)
        if kv_events is not None:
            kv_events.stop()
        raise StartupError(str(error)) from error
    discovery = start_discovery(process, pool)
    # Set before the ready line, so that whoever waits for it finds the status current;
    # from then on it follows the workers.
    await set_serving(health, [SERVICE_NAME], serving=bool(pool.connected_engines()))
    health_task = asyncio.create_task(follow_workers(pool, health, [SERVICE_NAME]))
    announce_ready(
        ready_line(
            process,
            pool,
            metrics_server.port if metrics_server else None,
            http_front.port if http_front else None,
        )
    )
    stop = stop_event()
    await stop.wait()
    # Graceful shutdown: NOT_SERVING first (balancers stop sending), new calls get
    # UNAVAILABLE, calls in flight get --grace-period to finish; then stop.
    health_task.cancel()
    await asyncio.gather(health_task, return_exceptions=True)
    await set_serving(health, [SERVICE_NAME], serving=False)
    log.info("shutting_down", grace_period_s=faults.grace_period_s)
    cut = await service.drain(faults.grace_period_s)
    log.info("drained", requests_cut=cut)
    stages = [("grpc server", server.stop(grace=1.0)), ("workers", pool.stop())]
    if discovery is not None:
        stages.insert(0, ("discovery", discovery.stop()))
    if metrics_server is not None:
        stages.append(("metrics server", metrics_server.stop()))
    if http_front is not None:
        stages.insert(0, ("http server", http_front.stop()))
    for name, stage in stages:
        await bounded_stage(name, stage)
    if kv_events is not None:
        kv_events.stop()


def main(argv: list[str] | None = None) -> int:
    parent_watch.die_with_parent()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        if args.api_processes:
            from scheduler_svc.split.core_process import serve_core

            uvloop.run(serve_core(args, argv))
        else:
            uvloop.run(serve(args))
    except StartupError as error:
        print(f"scheduler_svc: cannot start: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:  # split.core_process.ApiProcessExited
        print(f"scheduler_svc: stopped: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
