"""python -m worker_svc --port 50061 [--host 0.0.0.0] [--model PATH]
[--dtype auto|float32|bfloat16|float16|int8] [--model-impl auto|cbserve|transformers]
[--num-kv-blocks N | --kv-cache-memory BYTES] [--block-size 16] [--threads N]
[--attention-backend auto|torch|cpu|flash_attn] [--device auto|cpu|cuda:0] [--metrics-port PORT]
[--grace-period 30] [--log-level info]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from common import parent_watch
from common.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WORKER_PORT, default_model_path
from common.logging import configure_logging
from worker_svc.config import (
    ATTENTION_BACKENDS,
    DEFAULT_DTYPE,
    DEFAULT_GRACE_PERIOD_S,
    DTYPES,
    MODEL_IMPLS,
    WorkerConfig,
)

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`1073741824`, `1G`, `1GiB` and `1gb` are all 2**30 bytes: KV budgets are binary."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r}")
    number, unit = int(match.group(1)), match.group(2).lower()
    return number * 1024 ** "_kmgt".index(unit or "_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker_svc", description="cbserve model worker (gRPC)"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=DEFAULT_WORKER_PORT)
    parser.add_argument("--model", default=None, help="HF directory or .gguf file")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=os.environ.get("CBSERVE_DTYPE", DEFAULT_DTYPE),
        help="compute path (env CBSERVE_DTYPE): auto (default) takes the fastest this CPU "
        "has (measured table, see bench/kernel_bench.py); float32 is the reference; "
        "int8 is int8 weights x int8 activations (fbgemm); bfloat16/float16 need native "
        "support on a CPU",
    )
    parser.add_argument(
        "--model-impl",
        choices=MODEL_IMPLS,
        default="auto",
        help="cbserve: the own forward (worker_svc/models); transformers: its modules; "
        "auto (default): the own forward where the architecture has one",
    )
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument("--num-kv-blocks", type=int, default=None)
    pool.add_argument("--kv-cache-memory", type=parse_bytes, default=None, metavar="BYTES")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=-1,
        help="serve Prometheus metrics (forward time per step) at http://HOST:PORT/metrics; "
        "0 picks a free port, printed in the ready line (default -1: off, so that several "
        "workers on one host need no port each)",
    )
    parser.add_argument(
        "--grace-period",
        type=_positive_seconds,
        default=DEFAULT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="on SIGTERM: health NOT_SERVING, and the open Step stream gets this long to be "
        f"closed by its scheduler before the worker ends it and exits (default "
        f"{DEFAULT_GRACE_PERIOD_S:g})",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    return parser


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def config_from_args(args: argparse.Namespace, model: str | None = None) -> WorkerConfig:
    """The validated WorkerConfig the flags describe; raises ValueError when invalid.

    `model` overrides --model (the deployment tests check flags without a model on disk).
    """
    return WorkerConfig(
        model=model or args.model or default_model_path(),
        dtype=args.dtype,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory=args.kv_cache_memory,
        attention_backend=args.attention_backend,
        model_impl=args.model_impl,
        device=args.device,
        threads=args.threads,
        host=args.host,
        port=args.port,
    )


def main(argv: list[str] | None = None) -> int:
    parent_watch.die_with_parent()
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"worker_svc: invalid arguments: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    from worker_svc.server import run

    return run(config, args.metrics_port, args.grace_period)


if __name__ == "__main__":
    sys.exit(main())
