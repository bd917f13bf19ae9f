"""A projection whose weight stays in GGUF blocks (Q4_1 or Q8_0), times float32
activations, through the own C kernel (compute/qblock.py).

The blocks are a buffer, not a parameter: they are uint8 and never trained, and a
buffer still moves with `.to()` and counts in the module's memory.
"""

from __future__ import annotations

import os

import torch

from worker_svc.compute.linear import Projection
from worker_svc.compute.qblock import (
    QK,
    BlockFormat,
    dense_matmul,
    dequantize,
    load_vnni_kernel,
    qblock_matmul,
    quantize,
    vnni_matmul,
)

# From this many rows of x, a projection dequantizes its weight in cache-sized chunks
# for torch's float32 GEMM instead of running the block kernel: on the model's shapes
# (bench/qblock_bench.py, 1 thread, AVX-512 Zen 4) the kernel led at M = 16 (70-75 vs
# 61-65 GFLOP/s) and the chunked GEMM at M = 64 (91-92 vs 78) and 256 (97-99 vs 78-80).
# The LM head, 30 MB of Q8_0, stays on the kernel at every M (56 vs 49 at M = 64):
# its dequantized chunks would stream 113 MB through the caches a call.
DENSE_FROM_M = 48
# Where the CPU has AVX-512 VNNI, every projection (the Q8_0 head too, whatever its
# dense_from_m) from this many rows takes 16-bit activations in blocks of 32 and integer
# dot products (kernels/qblock_vnni.c): 140 vs 92 (dense) and 79 (kernel) GFLOP/s at
# M = 64, 175 vs 102 at M = 256, on one Zen 4 thread; relative error 2e-5. Below it
# (39 vs 60 at M = 7) the float kernel is faster. CBSERVE_QBLOCK_VNNI=0 turns it off.
VNNI_FROM_M = 16


class QBlockLinear(Projection):
    """y = x @ W.T, W `[out, in]` held as blocks `[out, in / 32 * block_bytes]`."""

    def __init__(
        self,
        blocks: torch.Tensor,
        fmt: BlockFormat,
        in_features: int,
        dense_from_m: int | None = DENSE_FROM_M,
    ):
        super().__init__()
        self.dense_from_m = dense_from_m  # None: the block kernel at every M
        self.vnni = (
            os.environ.get("CBSERVE_QBLOCK_VNNI", "1") != "0" and load_vnni_kernel() is not None
        )
        if blocks.dtype != torch.uint8 or blocks.shape[1] != in_features // QK * fmt.block_bytes:
            raise ValueError(f"{tuple(blocks.shape)} {blocks.dtype} are not {fmt.name} rows")
        self.out_features, self.in_features = blocks.shape[0], in_features
        self.format = fmt
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, fmt: BlockFormat, **kwargs) -> QBlockLinear:
        return cls(quantize(weight, fmt), fmt, weight.shape[1], **kwargs)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by (for tests and references)."""
        return dequantize(self.blocks, self.format)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.vnni and x.shape[0] >= VNNI_FROM_M:
            return vnni_matmul(x, self.blocks, self.format, self.in_features)
        if self.dense_from_m is not None and x.shape[0] >= self.dense_from_m:
            return dense_matmul(x, self.blocks, self.format, self.in_features)
        return qblock_matmul(x, self.blocks, self.format, self.in_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, format={self.format.name}"
