"""The block kernel per format (compute/qblock.py's FORMATS) at small M, every variant,
on random blocks with valid scales (speed does not depend on the values).

    .venv/bin/python -m bench.micro.qblock_formats [--threads 2] [--rows 1,4] [--repeats 50]
        [--formats Q4_1,Q4_K] [--variants avx512] [--baseline DIR]

Shapes are SmolLM2-135M's down projection (576 x 1536: K a multiple of 256, so a
Q4_K_M file keeps its K-quant there) and a square 1536 x 1536. Each cell is GFLOP/s
(2 M N K per call) at the min (median) of --repeats calls; other processes on the
machine move the medians, so compare figures taken together.

--baseline DIR builds a second library from DIR (a copy of compute/kernels from another
commit: `git archive COMMIT worker_svc/compute/kernels | tar -x -C /tmp/base`, then DIR
is /tmp/base/worker_svc/compute/kernels) and times it in the same run, calls alternated
with the current kernel's, each cell then reading "now / baseline".
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from worker_svc.compute import qblock
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.compute.qblock import (
    FORMATS,
    VARIANTS,
    BlockFormat,
    quantize,
    supported_variants,
)
from worker_svc.native_build import build_and_load_parts

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


def load_baseline(kernels: Path) -> ctypes.CDLL:
    """The block kernel built from another copy of compute/kernels (same flags). A
    copy whose qblock_gemm.c calls a file this one no longer has fails to link."""
    # Today's parts that the other copy has (an older one may lack a newer file).
    parts = tuple(
        (kernels / path.name, flags)
        for path, flags in qblock.PARTS
        if (kernels / path.name).exists()
    )
    lib = build_and_load_parts("qblock_gemm_baseline", parts, qblock.LINK_FLAGS)
    lib.qblock_gemm.restype = ctypes.c_int
    lib.qblock_gemm.argtypes = qblock.load_qblock_kernel().qblock_gemm.argtypes
    return lib


def matmul_with(lib: ctypes.CDLL, x, blocks, fmt: BlockFormat, k: int, variant: str):
    out = torch.empty((x.shape[0], blocks.shape[0]), dtype=torch.float32)
    status = lib.qblock_gemm(
        fmt.code,
        VARIANTS[variant],
        blocks.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        blocks.shape[0],
        k,
        torch.get_num_threads(),
    )
    assert status == 0, status
    return out


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.qblock_formats") -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--variants", default="", help="default: every one this CPU runs")
    parser.add_argument("--baseline", type=Path, help="another copy of compute/kernels")
    args = parser.parse_args(argv)
    libs = [qblock.load_qblock_kernel()]
    if args.baseline is not None:
        libs.append(load_baseline(args.baseline))
    variants = args.variants.split(",") if args.variants else supported_variants()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}, {args.threads} threads; GFLOP/s min (median)")
    header = "  ".join(f"{n}x{k:<9d}" for n, k in SHAPES)
    print(f"{'format':6s} {'variant':8s} {'M':>3s}  {header}")
    for fmt in (FORMATS[name] for name in args.formats.split(",")):
        for variant in variants:
            for m in (int(r) for r in args.rows.split(",")):
                cells = []
                for n, k in SHAPES:
                    blocks, x = random_blocks(fmt, n, k), torch.randn(m, k)
                    calls = [
                        lambda lib=lib, x=x, b=blocks, k=k, f=fmt, v=variant: matmul_with(
                            lib, x, b, f, k, v
                        )
                        for lib in libs
                    ]
                    flops = 2.0 * m * n * k
                    figures = [
                        (flops / lo / 1e9, flops / med / 1e9)
                        for lo, med in alternated(calls, args.repeats)
                    ]
                    cells.append(" / ".join(f"{lo:5.1f} ({med:5.1f})" for lo, med in figures))
                print(f"{fmt.name:6s} {variant:8s} {m:3d}  " + "  ".join(cells))


def alternated(calls, repeats: int) -> list[tuple[float, float]]:
    """(min, median) seconds of each call, the calls taken in turn: A B A B ..."""
    times = [[] for _ in calls]
    for _ in range(3):
        for call in calls:
            call()
    for _ in range(repeats):
        for call, spent in zip(calls, times, strict=True):
            started = time.perf_counter()
            call()
            spent.append(time.perf_counter() - started)
    return [(min(t), statistics.median(t)) for t in times]


if __name__ == "__main__":
    main()
