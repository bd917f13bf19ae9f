"""The same workload on a full KV pool and on a fraction of it: what preemption costs.

    python -m bench.serving.memory_pressure [--fractions 1 0.25] [cbserve bench flags...]

For each fraction, runs `cbserve bench` (no baselines) with the worker's pool
set to that fraction of the tokens the whole workload needs at once (the sum
of prompt + max_tokens over all requests), then prints one row per pool:
output throughput, preemptions, prefix-cache hits, and the TTFT median and
p99 of the shortest quarter of the requests (by prompt + output tokens) -
the requests a scheduler with head-of-line blocking or preemption thrash
would hurt most.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from bench.harness.metrics import percentile
from bench.harness.workload import make_workload
from bench.serving import options, serve
from common.defaults import converted_model_dir

BLOCK_SIZE = 16
DEFAULT_WORKLOAD = [
    "--dataset", "random", "--num-prompts", "64", "--seed", "0",
    "--random-input-len", "16:128", "--random-output-len", "16:256",
]  # fmt: skip


def _tokens_needed(bench_flags: list[str]) -> int:
    """prompt + max_tokens summed over the workload that these bench flags describe."""
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(bench_flags)
    problem = options.check(args)  # also parses the length ranges
    if problem:
        raise SystemExit(f"cbserve bench flags: {problem}")
    requests = make_workload(
        args.dataset,
        args.num_prompts,
        args.seed,
        args.model or converted_model_dir(),
        max_output_tokens=args.max_output_tokens,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
    )
    return sum(request.prompt_len + request.max_tokens for request in requests)


def _row(label: str, blocks: int, run: dict) -> dict:
    requests = [r for r in run["requests"] if r["ttft_ms"] is not None]
    requests.sort(key=lambda r: r["prompt_tokens"] + r["output_tokens"])
    shortest = [r["ttft_ms"] for r in requests[: max(1, len(requests) // 4)]]
    summary, counters = run["summary"], run["info"].get("server_counters", {})
    return {
        "pool": label,
        "kv_blocks": blocks,
        "output_tok_s": summary.get("output_throughput"),
        "failed": summary.get("failed", 0),
        "preemptions": counters.get("cbserve_num_preemptions_total"),
        "prefix_cache_hit_tokens": counters.get("cbserve_prefix_cache_hits_total"),
        "short_quarter_ttft_p50_ms": round(percentile(shortest, 50), 1),
        "short_quarter_ttft_p99_ms": round(percentile(shortest, 99), 1),
    }


def _bench(flags: list[str], out_dir: Path) -> dict:
    code = serve.main([*flags, "--baselines", "", "--no-plots", "--out-dir", str(out_dir)])
    if code != 0:
        raise SystemExit(f"cbserve bench failed (exit {code}) with {flags}")
    return json.loads((out_dir / "results.json").read_text())["runs"][0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--out-dir", type=Path, default=Path("out/memory-pressure"))
    args, bench_flags = parser.parse_known_args(argv)
    bench_flags = bench_flags or DEFAULT_WORKLOAD
    rows, needed = [], _tokens_needed(bench_flags)
    for fraction in args.fractions:
        blocks = math.ceil(needed * fraction / BLOCK_SIZE)
        out_dir = args.out_dir / f"pool-{fraction:g}"
        run = _bench([*bench_flags, "--num-kv-blocks", str(blocks)], out_dir)
        rows.append(_row(f"{fraction:g} x {needed} tokens", blocks, run))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + " --- |" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key in keys) + " |")
    (args.out_dir / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
