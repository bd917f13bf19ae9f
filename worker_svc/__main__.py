"""python -m worker_svc --port 50061 [--host 0.0.0.0] [--model PATH]
[--dtype auto|float32|bfloat16|float16|int8] [--model-impl auto|cbserve|transformers|null]
[--null-step-ms MS] [--null-step-us-per-token US] [--null-eos-probability P]
[--num-kv-blocks N | --kv-cache-memory BYTES] [--block-size 16] [--threads N]
[--kv-cache-dtype auto|float32|float16|bfloat16]
[--attention-backend auto|torch|cpu|flash_attn] [--device auto|cpu|cuda:0] [--metrics-port PORT]
[--grace-period 30] [--log-level info]

Every flag is a WorkerConfig field (worker_svc/config.py), with the variable
CBSERVE_WORKER_<FLAG> as its default (`--help` lists them).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from common import parent_watch
from common.cli_config import FlagError, add_flags, build
from common.logging import configure_logging
from worker_svc.config import WorkerConfig, parse_bytes
from worker_svc.heap_policy import apply_heap_policy
from worker_svc.wait_policy import apply_wait_policy

__all__ = ["build_parser", "config_from_args", "main", "parse_bytes"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker_svc", description="cbserve model worker (gRPC)"
    )
    add_flags(parser, WorkerConfig)
    return parser


def config_from_args(args: argparse.Namespace, model: str | None = None) -> WorkerConfig:
    """The validated WorkerConfig the flags describe; raises ValueError (a FlagError naming
    the flag) when invalid.

    `model` overrides --model (the deployment tests check flags without a model on disk).
    """
    return build(WorkerConfig, args, **({"model": model} if model else {}))


def main(argv: list[str] | None = None) -> int:
    parent_watch.die_with_parent()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except FlagError as error:
        parser.error(str(error))
    configure_logging(config.log_level)
    # Before torch loads libgomp, which reads it once (worker_svc/wait_policy.py); the
    # worker_built log line says which policy is in effect.
    apply_wait_policy()
    # Before the model loads, so that every step's buffers come back from the heap
    # (worker_svc/heap_policy.py).
    apply_heap_policy()
    from worker_svc.server import run

    return run(config, config.metrics_port, config.grace_period_s)


def exit_without_teardown(code: int) -> None:
    """Ends the process once its output is flushed, skipping the interpreter's teardown:
    unloading torch's and transformers' thousands of modules takes most of a second
    and frees nothing the system would not take back at exit. Every stop of a worker
    (a deployment's rollout, each integration test's stack) waits for it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
