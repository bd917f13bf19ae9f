"""`make run` / `cbserve serve`: the whole stack on this machine, in the foreground.

Starts the worker(s) on the default model, then the scheduler, prints where
they listen (gRPC, the OpenAI-compatible HTTP API, metrics), and stops every
child on Ctrl-C (or when one of them dies).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass
from typing import ClassVar

from cbserve.local_stack import LocalStack
from common.cli_config import FlagError, add_flags, build, to_argv
from common.defaults import DEFAULT_METRICS_PORT, DEFAULT_SCHEDULER_PORT, DEFAULT_WORKER_PORT
from common.flag_fields import flag
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.edge_config import DEFAULT_HTTP_PORT, EdgeConfig
from worker_svc.config import WorkerConfig

# Passed on to every worker and to the scheduler as they are given: declared once, on
# the processes' own configs (so are their variables, CBSERVE_WORKER_DTYPE, ...).
WORKER_FLAGS = (
    "model",
    "dtype",
    "model_impl",
    "num_kv_blocks",
    "kv_cache_memory",
    "block_size",
    "threads",
    "attention_backend",
    "device",
    # `cbserve serve --model-impl null --null-step-ms 10`: a stack with no model.
    "null_step_ms",
    "null_step_us_per_token",
    "null_eos_probability",
)
SCHEDULER_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_waiting_requests",
    "enable_prefix_caching",
    "batching",
    "num_scheduler_steps",
)
# The scheduler's doors. --api-key is passed on as the scheduler's variable
# (LocalStack.scheduler_env), not on its command line; the TLS flags as they are.
EDGE_FLAGS = ("api_key", "tls_cert", "tls_key")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServeConfig:
    """Where `cbserve serve` puts the stack."""

    ENV_PREFIX: ClassVar[str] = "CBSERVE_SERVE_"

    host: str = flag("127.0.0.1", help="address everything listens on")
    port: int = flag(DEFAULT_SCHEDULER_PORT, help="scheduler port")
    worker_port: int = flag(DEFAULT_WORKER_PORT, help="first worker's port (others follow)")
    num_workers: int = flag(1, help="worker processes, each with the whole model")
    # On by default here (unlike the bare scheduler): `cbserve serve` is how a person
    # meets the service, with curl or the openai SDK as often as with gRPC.
    http_port: int = flag(
        DEFAULT_HTTP_PORT,
        help="the scheduler's OpenAI-compatible HTTP API (http://HOST:PORT/v1); 0 turns it off",
    )
    metrics_port: int = flag(
        DEFAULT_METRICS_PORT,
        help="the scheduler's Prometheus metrics (http://HOST:PORT/metrics); -1 turns them off",
    )
    log_level: str = flag("info", choices=LOG_LEVELS, help="the scheduler's and workers' log level")

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be in [0, 65535], got {self.http_port}")
        if not -1 <= self.metrics_port <= 65535 or self.metrics_port == 0:
            raise ValueError(f"metrics_port must be in [1, 65535] or -1, got {self.metrics_port}")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ServeConfig)
    add_flags(parser, WorkerConfig, only=WORKER_FLAGS, forward_to="worker")
    add_flags(parser, SchedulerConfig, only=SCHEDULER_FLAGS, forward_to="scheduler")
    add_flags(parser, EdgeConfig, only=EDGE_FLAGS, forward_to="scheduler")


def stack_from_args(args: argparse.Namespace) -> LocalStack:
    """The stack `cbserve serve` runs for these flags (not started); raises FlagError,
    naming the flag, before any process starts."""
    where = build(ServeConfig, args)
    build(WorkerConfig, args, model=args.model or "checked by the worker")
    build(SchedulerConfig, args)
    build(EdgeConfig, args)
    # The scheduler reads the tokenizer from the workers' model directory (not a GGUF file).
    model = args.model
    tokenizer = ["--tokenizer", model] if model and not model.endswith(".gguf") else []
    log_level = ["--log-level", where.log_level]
    keys = args.api_key or []
    return LocalStack(
        num_workers=where.num_workers,
        scheduler_port=where.port,
        metrics_port=where.metrics_port,
        http_port=where.http_port or None,
        worker_ports=[where.worker_port + i for i in range(where.num_workers)],
        worker_args=to_argv(args, WorkerConfig, WORKER_FLAGS) + log_level,
        scheduler_args=to_argv(args, SchedulerConfig, SCHEDULER_FLAGS)
        + to_argv(args, EdgeConfig, ("tls_cert", "tls_key"))
        + tokenizer
        + log_level,
        # Comma-separated, as the flag's variable takes several (a key holds no comma).
        scheduler_env={"CBSERVE_SCHEDULER_API_KEY": ",".join(keys)} if keys else {},
        host=where.host,
    )


def announce(stack: LocalStack) -> None:
    """Where everything listens, with a host a browser or curl can use."""
    shown = "localhost" if stack.host in ("0.0.0.0", "::") else stack.host
    print(f"cbserve is serving on {shown}:{stack.scheduler_port} (gRPC)", flush=True)
    if stack.http_url is not None:
        http = stack.http_url.replace(f"//{stack.host}:", f"//{shown}:")
        print(f"  OpenAI-compatible HTTP API: {http}/v1", flush=True)
    if stack.metrics_port > 0:
        print(f"  metrics: http://{shown}:{stack.metrics_port}/metrics", flush=True)
    for port in stack.worker_ports:
        print(f"  worker on {shown}:{port}", flush=True)
    if stack.scheduler_env.get("CBSERVE_SCHEDULER_API_KEY"):
        print("  API keys on: clients send `Authorization: Bearer KEY` (--api-key)", flush=True)
    question = '"What is the capital of France?"'
    address = f"{shown}:{stack.scheduler_port}"
    print(f"  try: cbserve generate --server {address} --chat {question}", flush=True)
    print("  Ctrl-C stops everything.", flush=True)


def serve(args: argparse.Namespace) -> int:
    try:
        stack = stack_from_args(args)
    except FlagError as error:
        print(f"cbserve serve: {error}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    print("starting cbserve: worker(s) load the model first ...", flush=True)
    try:
        stack.start()
        announce(stack)
        while not stopping.wait(0.5):
            dead = stack.first_exit()
            if dead is not None:
                print(
                    f"{dead.name} exited with code {dead.process.returncode}; stopping",
                    file=sys.stderr,
                )
                return 1
        return 0
    except (RuntimeError, TimeoutError) as error:
        print(f"cbserve: {error}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        print("cbserve stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cbserve.launch", description=__doc__.splitlines()[0]
    )
    add_serve_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
