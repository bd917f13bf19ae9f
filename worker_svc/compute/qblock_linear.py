"""A projection whose weight stays in GGUF blocks (any format of compute/qblock.py's
FORMATS), times float32 activations, through the own C kernel.

The blocks are a buffer, not a parameter: they are uint8 and never trained, and a
buffer still moves with `.to()` and counts in the module's memory.
"""

from __future__ import annotations

import functools
import os

import torch

from worker_svc.compute.cpu_features import cpu_flags
from worker_svc.compute.linear import Projection
from worker_svc.compute.measured import QBlockStrategy, closest_measured, has_bf16_dot_products
from worker_svc.compute.qblock import (
    BF16,
    BlockFormat,
    dense_matmul,
    dequantize,
    load_vnni_kernel,
    qblock_matmul,
    quantize,
    vnni_matmul,
)
from worker_svc.compute.qblock_vnni8 import vnni8_matmul

# Which kernel a projection takes by its number of rows M is measured per CPU class
# (compute/measured.py, QBlockStrategy; bench/qblock_bench.py prints the figures):
# - below both thresholds, the float block kernel (weights dequantized in registers);
# - from `vnni_from_m`, where the CPU has AVX-512 VNNI, 16-bit activation blocks and
#   integer dot products (kernels/qblock_vnni.c): on Zen 4, 270-320 GFLOP/s at M = 64 on
#   2 threads since its panels are transposed in registers (bench/RESULTS.md); on Ice
#   Lake the float kernel led up to M = 128 (measured before that change);
# - from `dense_from_m`, W dequantized in cache-sized chunks into torch's float32 GEMM.
# The LM head, 30 MB of Q8_0, never takes the dense chunks (dense_from_m=None): they
# would stream 113 MB of float32 through the caches a call. CBSERVE_QBLOCK_VNNI=0
# turns the VNNI kernel off. It reads Q4_1, Q8_0, the K-quants, Q5_0 and MXFP4 (BlockFormat.vnni;
# K-quants: kernels/qblock_kquants_vnni.c, ~1.8x their float kernel at M = 64 on Zen 4);
# a format without it takes the float block kernel or the dense chunks from any M.
# - from `bf16_gemm_from_m`, BF16 rows (a bfloat16 checkpoint on bfloat16-weights, a
#   bf16 GGUF), on a CPU with bf16 dot products: torch's bfloat16 GEMM on the rows
#   themselves (bf16_matmul), the activations rounded to bfloat16 as llama.cpp rounds
#   them for BF16 weights (its vec_dot_type); ~2x the float block kernel at M = 64 on
#   Zen 4, leading from M = 12 (bench/micro/bf16_crossover.py; the native step declines
#   such steps, models/qblock/native.py). CBSERVE_QBLOCK_BF16_GEMM_FROM_M (a row
#   count, or "off") overrides the measured one.
DEFAULT_STRATEGY = QBlockStrategy()
DENSE_FROM_M = DEFAULT_STRATEGY.dense_from_m
VNNI_FROM_M = DEFAULT_STRATEGY.vnni_from_m


@functools.cache
def strategy_here() -> QBlockStrategy:
    """This CPU's thresholds: its measured class's, else the defaults."""
    measured = closest_measured(cpu_flags())
    return measured.qblock if measured is not None else DEFAULT_STRATEGY


_HERE = object()  # the thresholds' default: this CPU's measured one
BF16_GEMM_ENV = "CBSERVE_QBLOCK_BF16_GEMM_FROM_M"


def bf16_gemm_threshold(
    fmt: BlockFormat, from_m: int | None = _HERE, flags: frozenset[str] | None = None
) -> int | None:
    """From how many rows a projection of `fmt` takes bf16_matmul, or None: never. Only
    BF16 rows, and only on a CPU with bf16 dot products (`flags`, default this CPU's):
    elsewhere torch widens bfloat16 in software, several times slower than float32."""
    if from_m is _HERE:
        configured = os.environ.get(BF16_GEMM_ENV, "").strip().lower()
        if configured in ("off", "none", "0"):
            from_m = None
        else:
            from_m = int(configured) if configured else strategy_here().bf16_gemm_from_m
    if fmt is not BF16 or from_m is None:
        return None
    if not has_bf16_dot_products(cpu_flags() if flags is None else flags):
        return None
    return max(1, from_m)


def bf16_matmul(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """x `[M, K]` float32 @ W.T for W's BF16 rows `[N, 2K]` uint8, viewed (no copy) as
    the bfloat16 `[N, K]` they are: x rounded to bfloat16 (nearest even, as the torch
    bfloat16 path's activations are), torch's bfloat16 GEMM (oneDNN: bf16 dot products,
    float32 sums), whose bfloat16 output is widened to float32: torch's CPU GEMM writes
    its inputs' dtype (aten::mm.dtype has no CPU kernel in torch 2.13)."""
    weight = blocks.view(torch.bfloat16)
    return torch.nn.functional.linear(x.to(torch.bfloat16), weight).float()


class QBlockLinear(Projection):
    """y = x @ W.T, W `[out, in]` held as blocks `[out, fmt.row_bytes(in)]`."""

    def __init__(
        self,
        blocks: torch.Tensor,
        fmt: BlockFormat,
        in_features: int,
        dense_from_m: int | None = _HERE,
        vnni_from_m: int | None = _HERE,
        bias: torch.Tensor | None = None,
        bf16_gemm_from_m: int | None = _HERE,
        flags: frozenset[str] | None = None,
    ):
        super().__init__()
        here = strategy_here()
        # None: the block kernel at every M (unless VNNI takes it).
        self.dense_from_m = here.dense_from_m if dense_from_m is _HERE else dense_from_m
        self.vnni_from_m = here.vnni_from_m if vnni_from_m is _HERE else vnni_from_m
        self.vnni = (
            fmt.vnni
            and self.vnni_from_m is not None
            and os.environ.get("CBSERVE_QBLOCK_VNNI", "1") != "0"
            and load_vnni_kernel() is not None
        )
        if (
            blocks.dtype != torch.uint8
            or in_features % fmt.block_weights
            or blocks.shape[1] != fmt.row_bytes(in_features)
        ):
            raise ValueError(f"{tuple(blocks.shape)} {blocks.dtype} are not {fmt.name} rows")
        self.out_features, self.in_features = blocks.shape[0], in_features
        self.format = fmt
        # 8-bit activation blocks where the VNNI kernel runs (qblock_vnni8.py): set by
        # the loader for the kinds CBSERVE_QBLOCK_ACT8 names (models/qblock/build.py).
        self.act8 = False
        # `flags`: the CPU's (default: this one's), for bf16 dot products.
        self.bf16_gemm_from_m = bf16_gemm_threshold(fmt, bf16_gemm_from_m, flags)
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        # float32, added to the product (Qwen2's q/k/v; GGUF keeps biases in F32 too).
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, fmt: BlockFormat, **kwargs) -> QBlockLinear:
        return cls(quantize(weight, fmt), fmt, weight.shape[1], **kwargs)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by (for tests and references)."""
        return dequantize(self.blocks, self.format)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bf16_gemm_from_m is not None and x.shape[0] >= self.bf16_gemm_from_m:
            out = bf16_matmul(x, self.blocks)
        elif self.vnni and x.shape[0] >= self.vnni_from_m:
            if self.act8:
                out = vnni8_matmul(x, self.blocks, self.in_features)
            else:
                out = vnni_matmul(x, self.blocks, self.format, self.in_features)
        elif self.dense_from_m is not None and x.shape[0] >= self.dense_from_m:
            out = dense_matmul(x, self.blocks, self.format, self.in_features)
        else:
            out = qblock_matmul(x, self.blocks, self.format, self.in_features)
        return out if self.bias is None else out.add_(self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, format={self.format.name}"
