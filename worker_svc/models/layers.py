"""The small building blocks of a decoder over a flat batch `[T, hidden]`.

Each one computes what transformers' Llama modules compute, in the same order
of floating-point operations where that decides float32 equality (RMSNorm in
float32, rotary embedding as `x * cos + rotate_half(x) * sin`), so that the
float32 reference mode stays token-identical to transformers' `generate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The statistics in float32 whatever the activation dtype, as transformers does.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE by position: cos/sin rows are looked up from a table built once.

    The table covers the model's whole length, so a step only indexes it with its
    positions tensor; a flat batch mixes many sequences, each at its own offset.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, dtype: torch.dtype):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [P, d/2]
        self.register_buffer("cos", freqs.cos().to(dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(dtype), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin rows `[T, 1, d/2]` for a step's positions: once a step, for every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[T, heads, d]` (any number of heads: q and k rotate in one call)."""
    x1, x2 = x.chunk(2, dim=-1)
    # transformers' q * cos + rotate_half(q) * sin, halves written out: the same
    # products and sums, so float32 results are bit-equal.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`[T, 2 * I]` from the fused gate/up projection -> `[T, I]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
