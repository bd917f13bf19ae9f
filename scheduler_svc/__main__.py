"""python -m scheduler_svc --port 50051 {--worker HOST:PORT ... | --worker-dns NAME:PORT}

Loads the tokenizer, connects to every --worker (waiting up to
--worker-connect-timeout for them to come up), starts following --worker-dns,
then serves cbserve.v1.Generation. Prints one line when ready; exits non-zero
with one clear message when it cannot start.

With --worker-dns the scheduler starts without waiting for any worker: it is
ready (listening) at once, and its health status turns SERVING when the first
worker behind the name connects.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import structlog
import uvloop

from cbserve.v1 import generation_pb2 as pb
from common import parent_watch
from common.defaults import DEFAULT_METRICS_PORT, DEFAULT_SCHEDULER_PORT, default_model_path
from common.grpc_server import PortUnavailable, create_server, enable_reflection, set_serving
from common.logging import announce_ready, configure_logging
from common.metrics_server import MetricsServer
from scheduler_svc.api.server import GenerationService
from scheduler_svc.api.serving_status import follow_workers
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.wire import add_to_server
from scheduler_svc.config import BATCHING_MODES, FaultConfig, SchedulerConfig
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers.client import WorkerLost
from scheduler_svc.workers.discovery import (
    WorkerDiscovery,
    dns_resolver,
    hosts_file_resolver,
    parse_target,
)
from scheduler_svc.workers.pool import WorkerPool

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name

log = structlog.get_logger("scheduler_svc")


class StartupError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = SchedulerConfig()
    parser = argparse.ArgumentParser(
        prog="python -m scheduler_svc", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_SCHEDULER_PORT, help="default 50051")
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a worker; repeat for several. Each must answer at start; a lost one is "
        "reconnected for as long as the scheduler runs",
    )
    parser.add_argument(
        "--worker-dns",
        type=_dns_target,
        default=None,
        metavar="NAME:PORT",
        help="follow every A/AAAA address behind NAME (e.g. a Kubernetes headless Service) "
        "as a worker on PORT: addresses that appear are added, those that vanish dropped",
    )
    parser.add_argument(
        "--worker-dns-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often --worker-dns is resolved again (default 5)",
    )
    parser.add_argument(
        "--worker-hosts-file",
        default=None,
        metavar="PATH",
        help="resolve --worker-dns from this file of `IP NAME` lines (the /etc/hosts "
        "format, re-read at every lookup) instead of DNS: for tests and hosts without DNS",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="Hugging Face model directory to read the tokenizer and chat template from "
        "(default: the converted default model)",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=defaults.max_num_seqs, help="most sequences in one step"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        help="token budget of one step; longer prompts are prefilled in chunks",
    )
    parser.add_argument(
        "--max-waiting-requests",
        type=int,
        default=defaults.max_waiting_requests,
        help="requests queued across all workers before Generate answers RESOURCE_EXHAUSTED "
        f"(default {defaults.max_waiting_requests})",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_prefix_caching,
        help="share the KV of equal prompt prefixes between requests (default on)",
    )
    parser.add_argument(
        "--batching",
        choices=BATCHING_MODES,
        default=defaults.batching,
        help="continuous (default): requests join and leave at every step; static: a batch "
        "runs until all its requests finish before new ones join (a baseline)",
    )
    faults = FaultConfig()
    parser.add_argument(
        "--worker-wait-timeout",
        type=float,
        default=faults.worker_wait_timeout_s,
        help="seconds accepted requests wait for a worker when none is connected, before "
        f"UNAVAILABLE (default {faults.worker_wait_timeout_s:g})",
    )
    parser.add_argument(
        "--worker-timeout",
        type=float,
        default=faults.worker_timeout_s,
        help="a worker that answers no keepalive ping for this many seconds (dead, stopped, "
        "unreachable) is lost, idle or mid-step, and its requests are recomputed on others; "
        f"also a one-token step's deadline (default {faults.worker_timeout_s:g}, at least 2)",
    )
    parser.add_argument(
        "--step-seconds-per-token",
        type=float,
        default=faults.step_seconds_per_token,
        help="what a step's deadline grows by for each token it computes, so that a long "
        f"prefill is not taken for a hang (default {faults.step_seconds_per_token:g})",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=faults.grace_period_s,
        help=f"on SIGTERM, seconds in-flight requests get to finish (default "
        f"{faults.grace_period_s:g})",
    )
    parser.add_argument(
        "--max-concurrent-streams",
        type=int,
        default=faults.max_concurrent_streams,
        help="Generate calls in flight at once before RESOURCE_EXHAUSTED (default "
        f"{faults.max_concurrent_streams})",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"serve Prometheus metrics at http://HOST:PORT/metrics (default "
        f"{DEFAULT_METRICS_PORT}; 0 picks a free port, -1 turns metrics off)",
    )
    parser.add_argument(
        "--worker-connect-timeout",
        type=float,
        default=120.0,
        help="seconds to wait at start for each --worker to answer (default 120); "
        "workers found through --worker-dns are retried for as long as they are listed",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if not args.worker and not args.worker_dns:
        parser.error("give at least one --worker HOST:PORT or a --worker-dns NAME:PORT")
    if args.worker_dns_interval <= 0:
        parser.error(f"--worker-dns-interval must be > 0, got {args.worker_dns_interval}")
    return args


def _dns_target(value: str) -> str:
    try:
        parse_target(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return value


async def serve(args: argparse.Namespace) -> None:
    try:
        config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_waiting_requests=args.max_waiting_requests,
            enable_prefix_caching=args.enable_prefix_caching,
            batching=args.batching,
        )
        faults = FaultConfig(
            worker_wait_timeout_s=args.worker_wait_timeout,
            worker_timeout_s=args.worker_timeout,
            step_seconds_per_token=args.step_seconds_per_token,
            grace_period_s=args.grace_period,
            max_concurrent_streams=args.max_concurrent_streams,
        )
        tokenizer = Tokenizer(args.tokenizer or default_model_path())
        server, health, _ = create_server(f"{args.host}:{args.port}")
    except (ValueError, FileNotFoundError, PortUnavailable) as error:
        raise StartupError(str(error)) from error
    metrics = SchedulerMetrics(model_name=tokenizer.name)
    pool = WorkerPool(
        config, tokenizer, metrics, connect_timeout_s=args.worker_connect_timeout, faults=faults
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
    metrics_server = None
    if args.metrics_port >= 0:
        metrics_server = MetricsServer(metrics.registry, args.host, args.metrics_port)
        try:
            await metrics_server.start()
        except OSError as error:
            raise StartupError(f"metrics port {args.metrics_port}: {error.strerror}") from error
    enable_reflection(server, [SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], serving=False)
    await server.start()
    try:
        await pool.start(args.worker, args.worker_connect_timeout)
    except (WorkerLost, ValueError) as error:
        await server.stop(grace=None)
        raise StartupError(str(error)) from error
    discovery = None
    if args.worker_dns:
        resolver = hosts_file_resolver(args.worker_hosts_file) if args.worker_hosts_file else None
        discovery = WorkerDiscovery(
            args.worker_dns, pool, args.worker_dns_interval, resolver or dns_resolver
        )
        discovery.start()
    # Set before the ready line, so that whoever waits for it finds the status current;
    # from then on it follows the workers.
    await set_serving(health, [SERVICE_NAME], serving=bool(pool.connected_engines()))
    health_task = asyncio.create_task(follow_workers(pool, health, [SERVICE_NAME]))
    announce_ready(_ready_line(args, pool, metrics_server))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    # Graceful shutdown: NOT_SERVING first (balancers stop sending), new calls get
    # UNAVAILABLE, calls in flight get --grace-period to finish; then stop.
    health_task.cancel()
    await asyncio.gather(health_task, return_exceptions=True)
    await set_serving(health, [SERVICE_NAME], serving=False)
    log.info("shutting_down", grace_period_s=faults.grace_period_s)
    cut = await service.drain(faults.grace_period_s)
    log.info("drained", requests_cut=cut)
    if discovery is not None:
        await discovery.stop()
    await server.stop(grace=1.0)
    await pool.stop()
    if metrics_server is not None:
        await metrics_server.stop()


def _ready_line(args: argparse.Namespace, pool: WorkerPool, metrics_server) -> str:
    engines = pool.connected_engines()
    parts = [f"scheduler ready on {args.host}:{args.port}"]
    if args.worker:
        parts.append(f"workers={','.join(args.worker)}")
    if args.worker_dns:
        parts.append(f"worker_dns={args.worker_dns}")
    if engines:
        parts.append(f"model={engines[0].client.description.model_name}")
    parts.append(f"kv_capacity_tokens={sum(engine.capacity_tokens for engine in engines)}")
    if metrics_server is not None:
        parts.append(f"metrics_port={metrics_server.port}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parent_watch.die_with_parent()
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        uvloop.run(serve(args))
    except StartupError as error:
        print(f"scheduler_svc: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
