"""A projection whose weight stays in GGUF blocks (Q4_1 or Q8_0), times float32
activations, through the own C kernel (compute/qblock.py).

The blocks are a buffer, not a parameter: they are uint8 and never trained, and a
buffer still moves with `.to()` and counts in the module's memory.
"""

from __future__ import annotations

import torch

from worker_svc.compute.linear import Projection
from worker_svc.compute.qblock import QK, BlockFormat, dequantize, qblock_matmul, quantize


class QBlockLinear(Projection):
    """y = x @ W.T, W `[out, in]` held as blocks `[out, in / 32 * block_bytes]`."""

    def __init__(self, blocks: torch.Tensor, fmt: BlockFormat, in_features: int):
        super().__init__()
        if blocks.dtype != torch.uint8 or blocks.shape[1] != in_features // QK * fmt.block_bytes:
            raise ValueError(f"{tuple(blocks.shape)} {blocks.dtype} are not {fmt.name} rows")
        self.out_features, self.in_features = blocks.shape[0], in_features
        self.format = fmt
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, fmt: BlockFormat) -> QBlockLinear:
        return cls(quantize(weight, fmt), fmt, weight.shape[1])

    def dequantized(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by (for tests and references)."""
        return dequantize(self.blocks, self.format)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qblock_matmul(x, self.blocks, self.format, self.in_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, format={self.format.name}"
