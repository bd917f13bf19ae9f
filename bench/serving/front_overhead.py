"""The HTTP front's overhead against gRPC: `make bench-front`
(python -m bench.serving.front_overhead).

The same workload (random prompts, 64 streams in flight by default) is sent once over
cbserve's gRPC API and once over its OpenAI-compatible HTTP front (`cbserve bench
--backend openai`), each on a fresh local stack of the same flags, so that neither
finds the other's prompts in its prefix cache. Each run writes its own results under
--out-dir (grpc/, http/); a last table puts the two side by side with the ratios.
Everything else (model, dtype, threads) is the stack's default unless given as
--worker-args / --scheduler-args.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

SUMMARY_ROWS = (
    ("output tok/s", ("output_throughput",)),
    ("requests/s", ("request_throughput",)),
    ("TTFT median (ms)", ("ttft_ms", "median")),
    ("TTFT p99 (ms)", ("ttft_ms", "p99")),
    ("ITL median (ms)", ("itl_ms", "median")),
    ("ITL p99 (ms)", ("itl_ms", "p99")),
    ("failed", ("failed",)),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving.front_overhead", description=__doc__
    )
    parser.add_argument("--concurrency", type=int, default=64, help="streams in flight (64)")
    parser.add_argument("--num-prompts", type=int, default=256, help="requests per run (256)")
    parser.add_argument("--input-len", default="128", help="prompt tokens, N or LOW:HIGH (128)")
    parser.add_argument("--output-len", default="128", help="output tokens, N or LOW:HIGH (128)")
    parser.add_argument("--worker-args", default="", help="more worker flags, one string")
    parser.add_argument("--scheduler-args", default="", help="more scheduler flags, one string")
    parser.add_argument("--out-dir", type=Path, default=Path("out/bench-front"))
    return parser


def _bench_argv(args: argparse.Namespace, out_dir: Path) -> list[str]:
    return [
        "--dataset", "random", "--num-prompts", str(args.num_prompts),
        "--random-input-len", args.input_len, "--random-output-len", args.output_len,
        "--max-concurrency", str(args.concurrency), "--no-plots", "--out-dir", str(out_dir),
    ]  # fmt: skip


def _measure(args: argparse.Namespace, front: str) -> dict:
    """One run on a fresh stack; returns the summary of its one column."""
    from bench.serving import serve
    from cbserve.local_stack import LocalStack

    out_dir = args.out_dir / front
    stack = LocalStack(
        http_port=0,
        worker_args=shlex.split(args.worker_args),
        scheduler_args=shlex.split(args.scheduler_args),
    )
    print(f"starting a local stack for the {front} run ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        argv = _bench_argv(args, out_dir) + ["--metrics-url", stack.metrics_url]
        if front == "grpc":
            argv += ["--server", stack.address]
        else:
            argv += ["--backend", "openai", "--base-url", f"{stack.http_url}/v1"]
        if serve.main(argv) != 0:
            raise RuntimeError(f"the {front} run failed (see above)")
    finally:
        stack.stop()
    (run,) = json.loads((out_dir / "results.json").read_text())["runs"]
    return run["summary"]


def _value(summary: dict, path: tuple[str, ...]) -> float:
    value = summary
    for key in path:
        value = value[key]
    return float(value)


def comparison_table(grpc: dict, http: dict, concurrency: int) -> str:
    lines = [
        f"| {concurrency} streams | gRPC | HTTP (OpenAI API) | HTTP / gRPC |",
        "|---|---:|---:|---:|",
    ]
    for name, path in SUMMARY_ROWS:
        ours, theirs = _value(grpc, path), _value(http, path)
        ratio = f"{theirs / ours:.3f}" if ours else "-"
        lines.append(f"| {name} | {ours:g} | {theirs:g} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    summaries = {front: _measure(args, front) for front in ("grpc", "http")}
    table = comparison_table(summaries["grpc"], summaries["http"], args.concurrency)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "comparison.md").write_text(table + "\n")
    print("\n" + table)
    print(f"wrote {args.out_dir / 'comparison.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
