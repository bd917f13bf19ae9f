"""The flags of `cbserve bench` (also `python -m bench`), named as in `vllm bench serve`.

Kept apart from the benchmark itself and free of heavy imports, so that building the
`cbserve` command line stays quick for its other subcommands.
"""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path

BASELINES = ("static", "hf", "llamacpp")
DTYPES = ("float32", "bfloat16", "float16")
# The worker's compute paths (worker_svc/config.py): auto takes the fastest on this CPU.
WORKER_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")


def _rates(text: str) -> list[float]:
    # "inf", "4", or "1,2,4": several rates run one after another.
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a request rate: {text!r}") from None
    if not rates or any(rate <= 0 or math.isnan(rate) for rate in rates):
        raise argparse.ArgumentTypeError(f"request rates must be > 0 (or inf), got {text!r}")
    return rates


def _baselines(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown baseline(s) {unknown}; choose from {BASELINES}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("workload")
    data.add_argument("--dataset", choices=("sharegpt", "random"), default="sharegpt")
    data.add_argument("--num-prompts", type=int, default=200)
    data.add_argument("--seed", type=int, default=0, help="sampling, arrivals, request seeds")
    data.add_argument(
        "--max-output-tokens",
        type=int,
        default=256,
        help="cap on a ShareGPT request's max_tokens (its reply's length); default 256",
    )
    data.add_argument("--random-input-len", default="16:128", metavar="N|LOW:HIGH")
    data.add_argument("--random-output-len", default="16:256", metavar="N|LOW:HIGH")

    load = parser.add_argument_group("arrivals and requests")
    load.add_argument(
        "--request-rate",
        type=_rates,
        nargs="+",
        action="append",
        default=None,
        metavar="R",
        help="requests/s; inf (default) sends all at once; several (1 2 4 or 1,2,4) run in turn",
    )
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    # vLLM's `bench serve` sends a ShareGPT request with max_tokens = the reply's length
    # but leaves ignore_eos off unless --ignore-eos is given. Here it is on by default:
    # transformers' batched generate can only run every row for a fixed count, and the
    # continuous/static/transformers ratios are only fair when every system produces the
    # same tokens (a system that stops early at EOS would look faster for doing less).
    # --no-ignore-eos gives vLLM's default.
    load.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly max_tokens per request (default: on; vLLM's default is off)",
    )
    load.add_argument(
        "--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs: ttft, tpot, e2el"
    )

    target = parser.add_argument_group("what is measured")
    target.add_argument("--server", default=None, metavar="HOST:PORT", help="a running stack")
    target.add_argument(
        "--metrics-url", default=None, help="its scheduler's /metrics, read around each rate"
    )
    target.add_argument(
        "--baselines",
        type=_baselines,
        default=[],
        metavar="LIST",
        help="comma-separated, from static (cbserve --batching static), "
        "hf (transformers generate), llamacpp (llama.cpp's llama-server: make bench-peers)",
    )
    target.add_argument(
        "--threads",
        type=int,
        default=None,
        help="compute threads of the worker and of llama-server alike "
        "(default: the worker's own default, torch's thread count)",
    )
    target.add_argument("--model", type=Path, default=None, help="HF model directory")
    target.add_argument(
        "--dtype",
        choices=WORKER_DTYPES,
        default="auto",
        help="the worker's compute path (default auto: the fastest this CPU has)",
    )
    target.add_argument(
        "--hf-dtype",
        choices=DTYPES,
        default=None,
        help="transformers' dtype (default: --dtype where transformers has it, else float32)",
    )
    target.add_argument("--hf-batch-size", type=int, default=64)
    target.add_argument("--max-num-seqs", type=int, default=None)
    target.add_argument("--max-num-batched-tokens", type=int, default=None)
    target.add_argument("--num-kv-blocks", type=int, default=None)
    target.add_argument("--worker-args", default="", help="more worker flags, one string")
    target.add_argument("--scheduler-args", default="", help="more scheduler flags, one string")

    out = parser.add_argument_group("output")
    out.add_argument("--out-dir", type=Path, default=Path("out/bench"))
    out.add_argument("--no-plots", action="store_true")
    out.add_argument("--no-progress", action="store_true")


def check(args: argparse.Namespace) -> str | None:
    """Flattens and checks the parsed flags; returns an error message or None."""
    rates = [rate for given in args.request_rate or [] for group in given for rate in group]
    args.request_rate = list(dict.fromkeys(rates)) or [math.inf]
    args.hf_dtype = args.hf_dtype or (args.dtype if args.dtype in DTYPES else "float32")
    if args.num_prompts < 1:
        return "--num-prompts must be >= 1"
    if args.burstiness <= 0:
        return "--burstiness must be > 0"
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return "--max-concurrency must be >= 1"
    if args.threads is not None and args.threads < 1:
        return "--threads must be >= 1"
    if args.server and "static" in args.baselines:
        return "the static baseline starts its own stack: leave out --server or the baseline"
    from bench.workload import parse_range

    try:
        args.random_input_len = parse_range(args.random_input_len)
        args.random_output_len = parse_range(args.random_output_len)
        from bench.metrics import parse_goodput

        args.goodput = parse_goodput(args.goodput)
    except ValueError as error:
        return str(error)
    return None


def worker_threads(args: argparse.Namespace) -> int:
    """The worker's compute threads: --threads in --worker-args, else --threads, else
    what the worker takes by default (torch's intra-op thread count on this machine).
    llama-server gets the same number, so that both use the same cores."""
    given = shlex.split(args.worker_args)
    for index, flag in enumerate(given):
        if flag == "--threads" and index + 1 < len(given):
            return int(given[index + 1])
        if flag.startswith("--threads="):
            return int(flag.split("=", 1)[1])
    if args.threads is not None:
        return args.threads
    import torch

    return torch.get_num_threads()


def stack_args(args: argparse.Namespace, batching: str | None) -> tuple[list[str], list[str]]:
    """Worker and scheduler flags of a local stack; batching None leaves the default."""
    worker = ["--dtype", args.dtype]
    if args.threads is not None:
        worker += ["--threads", str(args.threads)]
    if args.model:
        worker += ["--model", str(args.model)]
    if args.num_kv_blocks is not None:
        worker += ["--num-kv-blocks", str(args.num_kv_blocks)]
    scheduler = ["--tokenizer", str(args.model)] if args.model else []
    for flag in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None:
            scheduler += ["--" + flag.replace("_", "-"), str(value)]
    if batching:
        scheduler += ["--batching", batching]
    return worker + shlex.split(args.worker_args), scheduler + shlex.split(args.scheduler_args)
