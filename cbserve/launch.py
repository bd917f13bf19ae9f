"""`make run` / `cbserve serve`: the whole stack on this machine, in the foreground.

Starts the worker(s) on the default model, then the scheduler, prints where
they listen, and stops every child on Ctrl-C (or when one of them dies).
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
from common.defaults import DEFAULT_SCHEDULER_PORT, DEFAULT_WORKER_PORT
from common.flag_fields import flag
from scheduler_svc.config import SchedulerConfig
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
)
SCHEDULER_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_waiting_requests",
    "enable_prefix_caching",
    "batching",
    "num_scheduler_steps",
)


@dataclass(frozen=True)
class ServeConfig:
    """Where `cbserve serve` puts the stack."""

    ENV_PREFIX: ClassVar[str] = "CBSERVE_SERVE_"

    host: str = flag("127.0.0.1", help="address everything listens on")
    port: int = flag(DEFAULT_SCHEDULER_PORT, help="scheduler port")
    worker_port: int = flag(DEFAULT_WORKER_PORT, help="first worker's port (others follow)")
    num_workers: int = flag(1, help="worker processes, each with the whole model")

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ServeConfig)
    add_flags(parser, WorkerConfig, only=WORKER_FLAGS, forward_to="worker")
    add_flags(parser, SchedulerConfig, only=SCHEDULER_FLAGS, forward_to="scheduler")


def serve(args: argparse.Namespace) -> int:
    try:
        where = build(ServeConfig, args)
        # Checked here too, so that a bad value is named before any process starts.
        build(WorkerConfig, args, model=args.model or "checked by the worker")
        build(SchedulerConfig, args)
    except FlagError as error:
        print(f"cbserve serve: {error}", file=sys.stderr)
        return 2
    # The scheduler reads the tokenizer from the workers' model directory (not a GGUF file).
    model = args.model
    tokenizer = ["--tokenizer", model] if model and not model.endswith(".gguf") else []
    stack = LocalStack(
        num_workers=where.num_workers,
        scheduler_port=where.port,
        worker_ports=[where.worker_port + i for i in range(where.num_workers)],
        worker_args=to_argv(args, WorkerConfig, WORKER_FLAGS),
        scheduler_args=to_argv(args, SchedulerConfig, SCHEDULER_FLAGS) + tokenizer,
        host=where.host,
    )
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    print("starting cbserve: worker(s) load the model first ...", flush=True)
    try:
        stack.start()
        print(f"cbserve is serving on {stack.address}", flush=True)
        for port in stack.worker_ports:
            print(f"  worker on {where.host}:{port}", flush=True)
        question = '"What is the capital of France?"'
        print(f"  try: cbserve generate --server {stack.address} --chat {question}", flush=True)
        print("  Ctrl-C stops everything.", flush=True)
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
