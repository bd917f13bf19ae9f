"""`make run` / `cbserve serve`: the whole stack on this machine, in the foreground.

Starts the worker(s) on the default model, then the scheduler, prints where
they listen, and stops every child on Ctrl-C (or when one of them dies).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from cbserve.local_stack import LocalStack
from common.defaults import DEFAULT_SCHEDULER_PORT, DEFAULT_WORKER_PORT


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address everything listens on")
    parser.add_argument("--port", type=int, default=DEFAULT_SCHEDULER_PORT, help="scheduler port")
    parser.add_argument(
        "--worker-port",
        type=int,
        default=DEFAULT_WORKER_PORT,
        help="first worker's port (others follow)",
    )
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--model", default=None, help="model directory or .gguf file")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16", "int8"],
        default=None,
        help="the workers' compute path (default: theirs, auto)",
    )
    parser.add_argument("--model-impl", choices=["auto", "cbserve", "transformers"], default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)


def _flag_list(args: argparse.Namespace, names: list[str]) -> list[str]:
    flags: list[str] = []
    for name in names:
        value = getattr(args, name)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def serve(args: argparse.Namespace) -> int:
    stack = LocalStack(
        num_workers=args.num_workers,
        scheduler_port=args.port,
        worker_ports=[args.worker_port + i for i in range(args.num_workers)],
        worker_args=_flag_list(args, ["model", "dtype", "model_impl", "num_kv_blocks"]),
        scheduler_args=_flag_list(args, ["max_num_seqs", "max_num_batched_tokens"])
        + (["--tokenizer", args.model] if args.model and not args.model.endswith(".gguf") else []),
        host=args.host,
    )
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    print("starting cbserve: worker(s) load the model first ...", flush=True)
    try:
        stack.start()
        print(f"cbserve is serving on {stack.address}", flush=True)
        for port in stack.worker_ports:
            print(f"  worker on {args.host}:{port}", flush=True)
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
