"""The block kernel per format (compute/qblock.py's FORMATS) at small M, every variant,
on random blocks with valid scales (speed does not depend on the values).

    .venv/bin/python -m bench.micro.qblock_formats [--threads 2] [--rows 1,4] [--repeats 50]

Shapes are SmolLM2-135M's down projection (576 x 1536: K a multiple of 256, so a
Q4_K_M file keeps its K-quant there) and a square 1536 x 1536. Each cell is GFLOP/s
(2 M N K per call) at the min (median) of --repeats calls; other processes on the
machine move the medians, so compare figures taken together.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bench.micro.qblock import timed
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.compute.qblock import (
    FORMATS,
    BlockFormat,
    qblock_matmul,
    quantize,
    supported_variants,
)

SHAPES = ((576, 1536), (1536, 1536))
# Where each format keeps its f16 scale(s) in a block: random bytes there could be
# infinities or NaNs, which no file holds.
SCALE_BYTES = {"Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(fmt: BlockFormat, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random blocks of `fmt` whose f16 scales are small finite numbers (F16 / BF16:
    weights of a trained model's scale)."""
    rng = np.random.default_rng(seed)
    if fmt.name in ("F16", "BF16"):
        weights = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * 0.05)
        return quantize(weights, fmt)
    raw = rng.integers(0, 256, size=(n, fmt.row_bytes(k)), dtype=np.uint8)
    groups = raw.reshape(n, k // fmt.block_weights, fmt.block_bytes)
    for at in SCALE_BYTES.get(fmt.name, (0,)):
        scales = rng.uniform(0.5, 2.0, size=groups.shape[:2]) * 1e-3
        groups[..., at : at + 2] = scales.astype(np.float16)[..., None].view(np.uint8)
    return torch.from_numpy(raw)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.qblock_formats")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}, {args.threads} threads; GFLOP/s min (median)")
    header = "  ".join(f"{n}x{k:<9d}" for n, k in SHAPES)
    print(f"{'format':6s} {'variant':8s} {'M':>3s}  {header}")
    for fmt in FORMATS.values():
        for variant in supported_variants():
            for m in (int(r) for r in args.rows.split(",")):
                cells = []
                for n, k in SHAPES:
                    blocks, x = random_blocks(fmt, n, k), torch.randn(m, k)
                    lo, med = timed(
                        lambda x=x, b=blocks, k=k, f=fmt, v=variant: qblock_matmul(x, b, f, k, v),
                        args.repeats,
                    )
                    flops = 2.0 * m * n * k
                    cells.append(f"{flops / lo / 1e9:5.1f} ({flops / med / 1e9:5.1f})")
                print(f"{fmt.name:6s} {variant:8s} {m:3d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
