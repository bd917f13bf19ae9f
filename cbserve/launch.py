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
from common.addresses import port_or_off
from common.cli_config import FlagError, add_flags, build, to_argv, to_env
from common.defaults import (
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_SCHEDULER_PORT,
    DEFAULT_WORKER_PORT,
)
from common.flag_fields import SERVE, flag, forwarded_flags
from scheduler_svc.config import SCHEDULER_CONFIGS, ProcessConfig
from worker_svc.config import WorkerConfig

# The processes' own flags that `cbserve serve` takes and passes on, as given: those
# their configs mark `forwarded_by=(SERVE, ...)` (with their variables,
# CBSERVE_WORKER_DTYPE, ...). Secret ones (--api-key) go as the scheduler's variable
# (LocalStack.scheduler_env), not on its command line.
WORKER_CONFIGS = (WorkerConfig,)
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServeConfig:
    """Where `cbserve serve` puts the stack."""

    ENV_PREFIX: ClassVar[str] = "CBSERVE_SERVE_"

    host: str = flag("127.0.0.1", help="address everything listens on")
    port: int = flag(DEFAULT_SCHEDULER_PORT, help="scheduler port")
    worker_port: int = flag(DEFAULT_WORKER_PORT, help="first worker's port (others follow)")
    num_workers: int = flag(1, help="worker processes, each with the whole model")
    num_prefill_workers: int = flag(
        0,
        help="of --num-workers, how many (the last ones) only run prompts (the scheduler's "
        "--prefill-worker); the others decode. At most --num-workers - 1",
    )
    # On by default here (unlike the bare scheduler): `cbserve serve` is how a person
    # meets the service, with curl or the openai SDK as often as with gRPC.
    http_port: int = flag(
        DEFAULT_HTTP_PORT,
        help="the scheduler's OpenAI-compatible HTTP API (http://HOST:PORT/v1); 0 turns it off",
    )
    metrics_port: int = flag(
        DEFAULT_METRICS_PORT,
        help="the scheduler's Prometheus metrics (http://HOST:PORT/metrics); 0 turns them off",
    )
    log_level: str = flag("info", choices=LOG_LEVELS, help="the scheduler's and workers' log level")

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.num_prefill_workers < self.num_workers:
            raise ValueError(
                f"num_prefill_workers must be in [0, num_workers - 1 = {self.num_workers - 1}], "
                f"got {self.num_prefill_workers}"
            )
        for name in ("http_port", "metrics_port"):
            object.__setattr__(self, name, port_or_off(name, getattr(self, name)))


def shared_flags() -> tuple[str, ...]:
    """The passed-on flags that the worker and the scheduler both declare (LoRA's
    --enable-lora, --max-loras, ...): serve takes each once and gives it to both, since
    a scheduler with adapters uses only workers started for them."""
    worker = {name for cls in WORKER_CONFIGS for name in forwarded_flags(cls, SERVE)}
    scheduler = {name for cls in SCHEDULER_CONFIGS for name in forwarded_flags(cls, SERVE)}
    return tuple(sorted(worker & scheduler))


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ServeConfig)
    shared = shared_flags()
    for cls in WORKER_CONFIGS:
        only = forwarded_flags(cls, SERVE)
        add_flags(parser, cls, only=[n for n in only if n not in shared], forward_to="worker")
        both = [name for name in only if name in shared]
        if both:
            # One argument, read by to_argv for both processes (the same dest).
            add_flags(parser, cls, only=both, forward_to="scheduler's and the worker")
    for cls in SCHEDULER_CONFIGS:
        only = [name for name in forwarded_flags(cls, SERVE) if name not in shared]
        add_flags(parser, cls, only=only, forward_to="scheduler")


def _passed_on(args: argparse.Namespace, configs) -> list[str]:
    return [arg for cls in configs for arg in to_argv(args, cls, forwarded_flags(cls, SERVE))]


def _passed_on_by_variable(args: argparse.Namespace, configs) -> dict[str, str]:
    env: dict[str, str] = {}
    for cls in configs:
        env.update(to_env(args, cls, forwarded_flags(cls, SERVE)))
    return env


def _check_passed_on(args: argparse.Namespace) -> None:
    """Each process's config checks the flags passed on to it, so that a bad value fails
    before any process starts; what serve sets itself (ports, --worker) is not checked."""
    only = forwarded_flags(WorkerConfig, SERVE)
    build(WorkerConfig, args, only=only, model=args.model or "checked by the worker")
    for cls in SCHEDULER_CONFIGS:
        only = forwarded_flags(cls, SERVE)
        # ProcessConfig refuses a scheduler without workers: serve gives it its own.
        workers = {"worker": ["set by serve"]} if cls is ProcessConfig else {}
        if only:
            build(cls, args, only=only, **workers)


def stack_from_args(args: argparse.Namespace) -> LocalStack:
    """The stack `cbserve serve` runs for these flags (not started); raises FlagError,
    naming the flag, before any process starts."""
    where = build(ServeConfig, args)
    _check_passed_on(args)
    # The scheduler reads the tokenizer from the workers' model: a directory's files, or
    # the tokenizer and chat template a .gguf carries (scheduler_svc/api/gguf_tokenizer.py).
    model = args.model
    tokenizer = ["--tokenizer", model] if model else []
    log_level = ["--log-level", where.log_level]
    return LocalStack(
        num_workers=where.num_workers,
        num_prefill_workers=where.num_prefill_workers,
        scheduler_port=where.port,
        # LocalStack's None is off (its 0 picks a free port, for the tests).
        metrics_port=where.metrics_port or None,
        http_port=where.http_port or None,
        worker_ports=[where.worker_port + i for i in range(where.num_workers)],
        worker_args=_passed_on(args, WORKER_CONFIGS) + log_level,
        scheduler_args=_passed_on(args, SCHEDULER_CONFIGS) + tokenizer + log_level,
        scheduler_env=_passed_on_by_variable(args, SCHEDULER_CONFIGS),
        host=where.host,
        # The scheduler waits for loading workers itself: nothing to order here.
        workers_first=False,
    )


def announce(stack: LocalStack) -> None:
    """Where everything listens, with a host a browser or curl can use."""
    shown = "localhost" if stack.host in ("0.0.0.0", "::") else stack.host
    print(f"cbserve is serving on {shown}:{stack.scheduler_port} (gRPC)", flush=True)
    if stack.http_url is not None:
        http = stack.http_url.replace(f"//{stack.host}:", f"//{shown}:")
        print(f"  OpenAI-compatible HTTP API: {http}/v1", flush=True)
    if stack.metrics_port is not None:
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
    print("starting cbserve: the worker(s) load the model ...", flush=True)
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
