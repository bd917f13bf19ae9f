"""The block-quantized kernel (worker_svc/compute/qblock.py) against float32's torch
matmul on the model's projection shapes, per M (rows of x: tokens in a step).

    .venv/bin/python -m bench.micro.qblock [--threads 2] [--rows 1,4,16,64,256] [--repeats 30]

Weights are the shipped GGUF's own blocks (layer 0's projections in Q4_1, the tied
LM head in Q8_0), fused as the forward fuses them (QKV, gate/up). Each cell is the
min and the median of --repeats timed calls, printed as GFLOP/s (2 M N K per call)
and, for the kernel, the weight bytes read per second. "step" sums a whole decode
step's projections as the forward runs them: 30 layers of the four, plus the head.
Strategies: "float32" is F.linear on the dequantized weight; "dequant+mm" the chunked
dequantize + torch GEMM; plain/avx2/avx512 the block kernel's variants; "vnni" the
16-bit-activation integer kernel (AVX-512 VNNI CPUs only). Each is applied to every
shape, whatever QBlockLinear would pick. The CPU is named on the first line; other
processes on the machine move the medians, so compare figures taken together.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from worker_svc.compute.cpu_features import cpu_name
from worker_svc.compute.qblock import (
    dense_matmul,
    dequantize,
    load_vnni_kernel,
    qblock_matmul,
    supported_variants,
    vnni_matmul,
)
from worker_svc.models.architectures import load_architecture
from worker_svc.models.qblock.gguf_blocks import read_gguf_blocks


def shapes_from_gguf(path) -> dict[str, tuple]:
    """name -> (blocks, format, K, count per step), from the GGUF's layer 0 and head
    (a fused weight's first run of rows where its parts mix formats)."""
    blocks = read_gguf_blocks(path, load_architecture("llama"), layers=(0,))
    layer = blocks.layers[0]
    count = blocks.num_layers
    return {
        "qkv": (*layer["qkv"][0], count),
        "o": (*layer["o"][0], count),
        "gate_up": (*layer["gate_up"][0], count),
        "down": (*layer["down"][0], count),
        "lm_head": (*blocks.lm_head, 1),
    }


def timed(fn, repeats: int) -> tuple[float, float]:
    """(min, median) seconds of one call, after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.qblock") -> None:
    from common.defaults import packaged_gguf_path

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4,16,64,256")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--variants", default=None, help="kernel variants (default: all here)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = shapes_from_gguf(args.gguf or packaged_gguf_path())
    variants = args.variants.split(",") if args.variants else supported_variants()
    print(f"CPU: {cpu_name()}, {args.threads} threads, torch {torch.__version__}")
    print("GFLOP/s min-time (median-time) per shape; step = 30 layers + head; GB/s = block bytes")
    names = list(shapes)
    print(
        f"{'how':14s} {'M':>4s} {'step':>14s} {'GB/s':>6s}  "
        + "  ".join(f"{n:>13s}" for n in names)
    )
    dense = {n: dequantize(b, fmt) for n, (b, fmt, _k, _c) in shapes.items()}
    with torch.inference_mode():
        for m in (int(r) for r in args.rows.split(",")):
            extra = ["vnni"] if load_vnni_kernel() is not None else []
            for how in ["float32", "dequant+mm", *variants, *extra]:
                cells, flops, t_min, t_med, nbytes = [], 0.0, 0.0, 0.0, 0.0
                for name in names:
                    blocks, fmt, k, count = shapes[name]
                    x = torch.randn(m, k)
                    if how == "float32":
                        weight = dense[name]
                        lo, med = timed(lambda x=x, w=weight: F.linear(x, w), args.repeats)
                    elif how == "vnni":
                        lo, med = timed(
                            lambda x=x, b=blocks, f=fmt, k=k: vnni_matmul(x, b, f, k),
                            args.repeats,
                        )
                    elif how == "dequant+mm":
                        lo, med = timed(
                            lambda x=x, b=blocks, f=fmt, k=k: dense_matmul(x, b, f, k),
                            args.repeats,
                        )
                    else:
                        lo, med = timed(
                            lambda x=x, b=blocks, f=fmt, k=k, v=how: qblock_matmul(x, b, f, k, v),
                            args.repeats,
                        )
                    f = 2.0 * m * blocks.shape[0] * k
                    cells.append(f"{f / lo / 1e9:5.1f} ({f / med / 1e9:5.1f})")
                    flops += f * count
                    t_min += lo * count
                    t_med += med * count
                    nbytes += blocks.numel() * count
                step = f"{flops / t_min / 1e9:5.1f} ({flops / t_med / 1e9:5.1f})"
                gbs = f"{nbytes / t_min / 1e9:6.1f}" if how != "float32" else f"{'':6s}"
                print(
                    f"{how:14s} {m:4d} {step:>14s} {gbs}  " + "  ".join(f"{c:>13s}" for c in cells)
                )


if __name__ == "__main__":
    main()
