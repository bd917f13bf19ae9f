"""How cost grows: output tok/s and inter-token latency of cbserve and llama-server
against the number of requests in flight and the prompt length.

    python -m bench.serving.sweep                                 # what `make bench-sweep` runs
    python -m bench.serving.sweep --concurrency 1,4 --prompt-len 32 --systems cbserve

Every point is one wave of `concurrency` requests of random token ids, each exactly
`--prompt-len` long and asking for exactly `--output-len` tokens (greedy, EOS
ignored), all sent at once and held to that many in flight (--max-concurrency). Each
point draws its own prompts (its own seed), so no point finds another's in a prefix
cache. cbserve runs one local stack for the whole sweep, its KV pool sized for the
largest point so that nothing is preempted; llama-server is started afresh for every
point, since its `--parallel` slots must equal the concurrency. Both get the same
`--threads`. Writes sweep.json, sweep.md (the table) and sweep.png (the two curves)
into --out-dir, and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

SYSTEMS = ("cbserve", "llamacpp")
BLOCK_SIZE = 16


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N[,N...], got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _systems(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"systems are among {SYSTEMS}, got {text!r}")
    return list(dict.fromkeys(names))


@dataclass
class Point:
    """One measured point of the sweep."""

    system: str
    prompt_len: int
    concurrency: int
    completed: int
    failed: int
    output_throughput: float
    itl_median_ms: float
    itl_p99_ms: float
    ttft_median_ms: float
    duration_s: float


def point(system: str, prompt_len: int, concurrency: int, timings, wall_s: float) -> Point:
    from bench.harness.metrics import summarize

    summary = summarize(timings, wall_s)
    return Point(
        system,
        prompt_len,
        concurrency,
        summary["completed"],
        summary["failed"],
        summary["output_throughput"],
        summary["itl_ms"]["median"],
        summary["itl_ms"]["p99"],
        summary["ttft_ms"]["median"],
        summary["duration_s"],
    )


def workload(args, vocab: list[int], prompt_len: int, concurrency: int):
    from bench.harness.workload import random_requests

    seed = args.seed * 1_000_003 + prompt_len * 1_009 + concurrency
    lengths = (prompt_len, prompt_len), (args.output_len, args.output_len)
    return random_requests(concurrency, seed, vocab, *lengths)


def kv_blocks(args) -> int:
    """A pool that holds the largest point whole: no preemption anywhere in the sweep."""
    tokens = max(args.concurrency) * (max(args.prompt_len) + args.output_len)
    return math.ceil(tokens / BLOCK_SIZE) + max(args.concurrency)


def _settings(args, concurrency: int):
    from bench.harness.runner import ClientSettings

    return ClientSettings(max_concurrency=concurrency, seed=args.seed, progress=args.progress)


def sweep_cbserve(args, vocab: list[int], threads: int) -> list[Point]:
    from bench.harness.runner import run_rates
    from cbserve.local_stack import LocalStack

    worker = ["--threads", str(threads), "--num-kv-blocks", str(kv_blocks(args))]
    worker += shlex.split(args.worker_args)
    scheduler = ["--max-num-seqs", str(max(128, max(args.concurrency)))]
    scheduler += shlex.split(args.scheduler_args)
    print("starting a local stack for cbserve ...", file=sys.stderr, flush=True)
    points = []
    with LocalStack(worker_args=worker, scheduler_args=scheduler) as stack:
        for prompt_len in args.prompt_len:
            for concurrency in args.concurrency:
                requests = workload(args, vocab, prompt_len, concurrency)
                settings = _settings(args, concurrency)
                (result,) = asyncio.run(
                    run_rates(stack.address, requests, [math.inf], settings, "cbserve")
                )
                points.append(
                    point("cbserve", prompt_len, concurrency, result.timings, result.wall_s)
                )
    return points


def sweep_llamacpp(args, vocab: list[int], threads: int) -> list[Point]:
    from bench.peers import llamacpp

    points = []
    for prompt_len in args.prompt_len:
        for concurrency in args.concurrency:
            requests = workload(args, vocab, prompt_len, concurrency)
            (result,) = llamacpp.run_rates(
                requests, [math.inf], _settings(args, concurrency), threads, args.out_dir / "logs"
            )
            points.append(point("llamacpp", prompt_len, concurrency, result.timings, result.wall_s))
    return points


def markdown(points: list[Point]) -> str:
    lines = [
        "| system | prompt tokens | concurrency | output tok/s | ITL median (ms) "
        "| ITL p99 (ms) | TTFT median (ms) | failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        name = "llama.cpp" if p.system == "llamacpp" else p.system
        lines.append(
            f"| {name} | {p.prompt_len} | {p.concurrency} | {p.output_throughput:g} "
            f"| {p.itl_median_ms:g} | {p.itl_p99_ms:g} | {p.ttft_median_ms:g} | {p.failed} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64, 128])
    parser.add_argument("--prompt-len", type=_ints, default=[32, 256, 1024])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--systems", type=_systems, default=list(SYSTEMS))
    parser.add_argument("--threads", type=int, default=None, help="default: torch's count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker-args", default="", help="more worker flags, one string")
    parser.add_argument("--scheduler-args", default="", help="more scheduler flags, one string")
    parser.add_argument("--out-dir", type=Path, default=Path("out/sweep"))
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    return parser


def main(argv: list[str] | None = None) -> int:
    from bench.harness import report, results
    from bench.serving import sweep_plots
    from common.defaults import converted_model_dir
    from scheduler_svc.api.tokenizer import Tokenizer

    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.output_len < 2:
        print(
            "bench.serving.sweep: --output-len must be >= 2 (an ITL needs two tokens)",
            file=sys.stderr,
        )
        return 2
    if "llamacpp" in args.systems:
        from bench.peers import llamacpp

        problem = llamacpp.missing()
        if problem:
            print(f"bench.serving.sweep: {problem}", file=sys.stderr)
            return 2
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    tokenizer = Tokenizer(converted_model_dir())
    vocab = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_token_ids]
    points: list[Point] = []
    for system in args.systems:
        measure = sweep_cbserve if system == "cbserve" else sweep_llamacpp
        points += measure(args, vocab, args.threads)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "bench.serving.sweep", *argv])
    machine = results.machine()
    table = markdown(points)
    header = f"Command: `{command}`\nMachine: {machine['cpu']}, {machine['cores']} cores, "
    header += f"{args.threads} threads each; output {args.output_len} tokens, EOS ignored"
    (args.out_dir / "sweep.md").write_text(f"{header}\n\n{table}\n")
    payload = {"command": command, "machine": machine, "threads": args.threads}
    payload["points"] = [asdict(p) for p in points]
    report.write_json(args.out_dir / "sweep.json", payload)
    written = [args.out_dir / "sweep.json", args.out_dir / "sweep.md"]
    if not args.no_plots:
        written += sweep_plots.write(args.out_dir / "sweep.png", points, header.split("\n")[1])
    print(table)
    print("wrote " + ", ".join(str(path) for path in written), file=sys.stderr)
    return 1 if any(p.failed for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
