"""Where a BF16 projection (bfloat16-weights) should leave the float block kernel for
torch's bfloat16 GEMM, per M (rows of x), on a CPU with bf16 dot products.

    .venv/bin/python -m bench.micro.bf16_crossover [--threads 1] [--rows 1,2,4,8,16,32,64]
        [--rounds 5] [--repeats 5] [--models smollm2,qwen3-512,qwen3-1024]

For each model shape, one layer's four projections (fused QKV, output, fused gate/up,
down) and the LM head, as BF16 rows of random weights, are multiplied three ways:
"block" the float block kernel (qblock_matmul: widened to float32 in registers),
"dense" the dequantized chunks into torch's float32 GEMM (dense_matmul) and "bf16"
compute/qblock_linear.bf16_matmul (activations rounded to bfloat16, torch's bfloat16
GEMM on the rows viewed as bfloat16). Calls alternate A B C A B C over --rounds rounds of
--repeats calls each; each cell is the median ms. "from" is the smallest M from which
bf16 leads the better of the other two at every larger M measured: the value for
compute/measured.py's QBlockStrategy.bf16_gemm_from_m. Other processes on the machine
move the medians: compare figures taken together.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from worker_svc.compute.cpu_features import cpu_flags, cpu_name
from worker_svc.compute.measured import has_bf16_dot_products
from worker_svc.compute.qblock import BF16, dense_matmul, qblock_matmul, quantize
from worker_svc.compute.qblock_linear import bf16_matmul


def projection_shapes(hidden, inter, heads, kv_heads, head_dim, vocab=49152):
    """[(name, N, K)] of one layer's projections as the own forward fuses them, and the head."""
    return [
        ("qkv", (heads + 2 * kv_heads) * head_dim, hidden),
        ("o", hidden, heads * head_dim),
        ("gate_up", 2 * inter, hidden),
        ("down", hidden, inter),
        ("head", vocab, hidden),
    ]


MODELS = {
    # SmolLM2-135M (the default model): 9 heads, 3 KV heads of 64.
    "smollm2": projection_shapes(576, 1536, 9, 3, 64),
    # bench/peers/gguf_files.py's QWEN3_SHAPE (the Qwen3-shaped checkpoint).
    "qwen3-512": projection_shapes(512, 1536, 8, 4, 64),
    # Qwen3-0.6B's layer (its head cut to the default tokenizer's 49,152 rows).
    "qwen3-1024": projection_shapes(1024, 3072, 16, 8, 128),
}
STRATEGIES = ("block", "dense", "bf16")


def calls_for(blocks: torch.Tensor, x: torch.Tensor, k: int) -> list:
    return [
        lambda: qblock_matmul(x, blocks, BF16, k),
        lambda: dense_matmul(x, blocks, BF16, k),
        lambda: bf16_matmul(x, blocks),
    ]


def median_ms(calls: list, rounds: int, repeats: int) -> list[float]:
    """Median ms of each call, the calls taken in turn."""
    times = [[] for _ in calls]
    for call in calls:
        call()
    for _ in range(rounds):
        for _ in range(repeats):
            for call, spent in zip(calls, times, strict=True):
                started = time.perf_counter()
                call()
                spent.append(time.perf_counter() - started)
    return [statistics.median(t) * 1e3 for t in times]


def crossover(rows: list[int], layer_ms: dict[int, list[float]]) -> int | None:
    """The smallest M from which bf16 leads both others at every larger M measured."""
    found = None
    for m in reversed(rows):
        block, dense, bf16 = layer_ms[m]
        if bf16 >= min(block, dense):
            break
        found = m
    return found


def measure_model(name: str, rows: list[int], rounds: int, repeats: int) -> int | None:
    weights = {part: (quantize(torch.randn(n, k) * 0.05, BF16), k) for part, n, k in MODELS[name]}
    print(f"\n{name}: " + ", ".join(f"{p} {b.shape[0]}x{k}" for p, (b, k) in weights.items()))
    print(f"{'M':>3s}  {'layer ms: block / dense / bf16':>32s}  {'head ms: block / bf16':>22s}")
    layer_ms = {}
    for m in rows:
        sums = [0.0, 0.0, 0.0]
        head = []
        for part, (blocks, k) in weights.items():
            x = torch.randn(m, k)
            if part == "head":  # the head never takes the dense chunks (qblock_linear)
                calls = calls_for(blocks, x, k)
                head = median_ms([calls[0], calls[2]], rounds, max(1, repeats // 2))
                continue
            for i, ms in enumerate(median_ms(calls_for(blocks, x, k), rounds, repeats)):
                sums[i] += ms
        layer_ms[m] = sums
        best = STRATEGIES[sums.index(min(sums))]
        print(
            f"{m:3d}  {sums[0]:9.3f} / {sums[1]:7.3f} / {sums[2]:7.3f} ({best:5s})"
            f"  {head[0]:8.3f} / {head[1]:8.3f}"
        )
    found = crossover(rows, layer_ms)
    print(f"{name}: bf16 GEMM leads from M = {found}")
    return found


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.bf16_crossover") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dots = has_bf16_dot_products(cpu_flags())
    print(f"CPU: {cpu_name()}, {args.threads} threads, bf16 dot products: {dots}")
    rows = [int(r) for r in args.rows.split(",")]
    models = args.models.split(",")
    found = [measure_model(name, rows, args.rounds, args.repeats) for name in models]
    if all(f is not None for f in found):
        print(f"\nbf16_gemm_from_m: {max(found)} (the largest of the models' crossovers)")
    else:
        print("\nbf16_gemm_from_m: None (the bf16 GEMM does not lead on every model)")


if __name__ == "__main__":
    main()
