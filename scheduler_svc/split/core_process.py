"""The core process of a split scheduler (--api-processes N): the pool, its engines and
step loops, and the hub its API processes talk to; no client port of its own.

Start: the hub's socket and the metrics directory (one private run directory), the
API processes (supervisor.py), the workers, then the ready line once every API
process has said HELLO, so that a launcher that waits for it finds the ports
answering. Stop (SIGTERM or SIGINT): the API processes drain their streams first
(they get SIGTERM, and the grace period), then the workers' streams close.

The core's /metrics (--metrics-port) and every API process's HTTP /metrics show one
view: the core's registry, which reads the API processes' request metrics from the
multiprocess directory (prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import tempfile

import structlog
from prometheus_client.multiprocess import MultiProcessCollector

from cbserve.ports import probe_port
from common.defaults import default_model_path
from common.errors import StartupError
from common.logging import announce_ready
from common.metrics_server import MetricsServer
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.flags import configs_from_args, edge_config_from_args
from scheduler_svc.grpc_security import grpc_server_security, worker_channel_security
from scheduler_svc.kv_events import open_kv_events
from scheduler_svc.lifecycle import bounded_stage, ready_line, start_discovery, stop_event
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.split import channel
from scheduler_svc.split.core_side import EdgeHub
from scheduler_svc.split.supervisor import ApiProcesses
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.workers.pool import NoWorkerReady, WorkerPool

log = structlog.get_logger("scheduler.core")


class ApiProcessExited(RuntimeError):
    """An API process died while the scheduler served: the scheduler stops (exit 1)."""


# How long the API processes get to load the tokenizer and listen.
API_READY_TIMEOUT_S = 120.0


async def serve_core(args: argparse.Namespace, argv: list[str]) -> None:
    process, config, faults = configs_from_args(args)
    edge = edge_config_from_args(args)
    try:
        grpc_server_security(edge)  # the API processes load it; a bad PEM fails here first
        worker_security = worker_channel_security(edge)
        tokenizer = Tokenizer(process.tokenizer or default_model_path())
    except (ValueError, FileNotFoundError) as error:
        raise StartupError(str(error)) from error
    if process.port == 0:
        # --port 0: one port the kernel picks, for all API processes, which share it.
        process = dataclasses.replace(process, port=probe_port(process.host))
    run_dir = tempfile.mkdtemp(prefix="cbserve-core-")  # 0700: only this user
    try:
        await _serve(process, config, faults, edge, tokenizer, worker_security, argv, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


async def _serve(process, config, faults, edge, tokenizer, worker_security, argv, run_dir):
    metrics_dir = os.path.join(run_dir, "metrics")
    os.mkdir(metrics_dir)
    metrics = SchedulerMetrics(tokenizer.name, requests=False)
    MultiProcessCollector(metrics.registry, path=metrics_dir)
    # The core publishes KV events: it alone holds the block managers.
    kv_events = open_kv_events(config.kv_events)
    pool = WorkerPool(
        config,
        tokenizer,
        metrics,
        connect_timeout_s=process.worker_connect_timeout_s,
        faults=faults,
        worker_security=worker_security,
        kv_events=kv_events.replica if kv_events else None,
    )
    metrics.watch(pool)
    lost: asyncio.Queue[int] = asyncio.Queue()
    hub = EdgeHub(
        pool,
        metrics.registry,
        GrammarCompiler.for_tokenizer(tokenizer),
        num_edges=process.api_processes,
        max_waiting_requests=config.max_waiting_requests,
        max_concurrent_streams=faults.max_concurrent_streams,
        on_edge_lost=lost.put_nowait,
    )
    socket_path = os.path.join(run_dir, "core.sock")
    hub_server = await channel.serve(socket_path, hub.on_channel)
    children = ApiProcesses(
        [*argv, "--port", str(process.port)], process.api_processes, socket_path, metrics_dir
    )
    await children.start()
    metrics_server = None
    try:
        if process.metrics_port:
            metrics_server = MetricsServer(metrics.registry, process.host, process.metrics_port)
            try:
                await metrics_server.start()
            except OSError as error:
                raise StartupError(
                    f"metrics port {process.metrics_port}: {error.strerror}"
                ) from error
        try:
            await pool.start(process.worker, process.worker_connect_timeout_s)
        except NoWorkerReady as error:
            raise StartupError(str(error)) from error
        await _wait_for_api_processes(hub, children)
    except BaseException:
        await children.stop(0.0)
        await pool.stop()
        if kv_events is not None:
            kv_events.stop()
        raise
    discovery = start_discovery(process, pool)
    announce_ready(
        ready_line(
            process,
            pool,
            metrics_server.port if metrics_server else None,
            edge.http_port or None,
            process.api_processes,
        )
    )
    stop = stop_event()
    stopped = asyncio.create_task(stop.wait())
    exited = asyncio.create_task(children.first_exit())
    done, _ = await asyncio.wait({stopped, exited}, return_when=asyncio.FIRST_COMPLETED)
    failure = None
    if exited in done and not stop.is_set():  # Ctrl-C reaches the children too: no failure
        index, code = exited.result()
        failure = f"API process {index} exited with code {code}; stopping the scheduler"
        log.error("API process exited", api_process=index, exit_code=code)
    stopped.cancel()
    exited.cancel()
    log.info("shutting_down", grace_period_s=faults.grace_period_s)
    await children.stop(faults.grace_period_s)
    stages = [("hub", hub.stop()), ("workers", pool.stop())]
    if discovery is not None:
        stages.insert(0, ("discovery", discovery.stop()))
    if metrics_server is not None:
        stages.append(("metrics server", metrics_server.stop()))
    for name, stage in stages:
        await bounded_stage(name, stage)
    if kv_events is not None:
        kv_events.stop()
    hub_server.close()
    if failure is not None:
        raise ApiProcessExited(failure)


async def _wait_for_api_processes(hub: EdgeHub, children: ApiProcesses) -> None:
    """Until every API process serves; StartupError if one exits first (a port taken)."""
    ready = asyncio.create_task(hub.ready.wait())
    exited = asyncio.create_task(children.first_exit())
    try:
        done, _ = await asyncio.wait(
            {ready, exited}, timeout=API_READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        ready.cancel()
        exited.cancel()
    if exited in done:
        index, code = exited.result()
        raise StartupError(f"API process {index} exited with code {code} before serving")
    if ready not in done:
        raise StartupError(f"the API processes did not serve within {API_READY_TIMEOUT_S:.0f}s")
