"""GFLOP/s of every compute path on the model's projection shapes, at M=1 and M=64.

    .venv/bin/python -m bench.micro.kernels [--threads 2] [--paths float32,int8] [--rows 1,64]

One forward step of a Llama-family model is, per layer, the fused QKV, the output,
the fused gate/up and the down projection, plus the LM head once. Each shape is
timed alone (random weights of the real shape, median of --repeats calls), and a
step's figure is its total FLOPs over its total time, the LM head included, as the
forward runs them. M=1 is a single stream's decode; M=64 is 64 decodes in a step.

The figures for this machine go to worker_svc/compute/measured.py (the table the
worker's `--dtype auto` reads): `--print-table-row` prints the entry to paste.
A path the CPU lacks (see compute.paths) is listed as such, not timed: torch
emulates it, slowly, and the number would only mislead.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from worker_svc.compute.cpu_features import cpu_flags, cpu_name
from worker_svc.compute.paths import PATHS
from worker_svc.compute.projections import make_projection
from worker_svc.models.config_file import attention_dims


def projection_shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (out_features, in_features, count per step) for a transformers config."""
    heads, kv_heads, head_dim = attention_dims(config)
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden, layers),
        "o": (hidden, heads * head_dim, layers),
        "gate_up": (2 * inter, hidden, layers),
        "down": (hidden, inter, layers),
        "lm_head": (config.vocab_size, hidden, 1),
    }


def time_projection(path: str, out_f: int, in_f: int, rows: int, repeats: int) -> float:
    """Median seconds of one call."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_f, in_f, generator=gen) * 0.02
    layer = make_projection(weight, path)
    x = torch.randn(rows, in_f, generator=gen).to(PATHS[path].activation_dtype)
    with torch.inference_mode():
        for _ in range(3):
            layer(x)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            layer(x)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def step_gflops(
    path: str, shapes: dict[str, tuple[int, int, int]], rows: int, repeats: int
) -> tuple[float, dict[str, float]]:
    """(GFLOP/s of a whole step's projections, GFLOP/s per shape)."""
    per_shape, total_flops, total_time = {}, 0.0, 0.0
    for name, (out_f, in_f, count) in shapes.items():
        seconds = time_projection(path, out_f, in_f, rows, repeats)
        flops = 2.0 * rows * out_f * in_f
        per_shape[name] = flops / seconds / 1e9
        total_flops += flops * count
        total_time += seconds * count
    return total_flops / total_time / 1e9, per_shape


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.kernels") -> None:
    from transformers import AutoConfig

    from common.defaults import default_model_path

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--rows", default="1,64", help="M values (tokens in a step)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--print-table-row", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
    torch.set_num_threads(args.threads)
    config = AutoConfig.from_pretrained(args.model or default_model_path())
    shapes = projection_shapes(config)
    flags = cpu_flags()
    rows = [int(r) for r in args.rows.split(",")]
    print(f"CPU: {cpu_name()}, {args.threads} threads, torch {torch.__version__}")
    print(f"{'path':9s} {'M':>4s} {'step GF/s':>10s}  " + "  ".join(f"{n:>8s}" for n in shapes))
    results: dict[str, dict[int, float]] = {}
    for name in args.paths.split(","):
        missing = PATHS[name].missing_on_cpu(flags)
        if missing:
            print(f"{name:9s} not timed: {missing}")
            continue
        for m in rows:
            step, per_shape = step_gflops(name, shapes, m, args.repeats)
            results.setdefault(name, {})[m] = step
            cells = "  ".join(f"{per_shape[n]:8.1f}" for n in shapes)
            print(f"{name:9s} {m:4d} {step:10.1f}  {cells}")
    if args.print_table_row:
        print({name: {m: round(v, 1) for m, v in by_m.items()} for name, by_m in results.items()})


if __name__ == "__main__":
    main()
