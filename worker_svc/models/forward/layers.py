"""The small building blocks of a decoder over a flat batch `[T, hidden]`.

Each one computes what transformers' modules compute, in the same order of
floating-point operations where that decides float32 equality (RMSNorm statistics in
float32, rotary embedding as `x * cos + rotate_half(x) * sin`), so that the float32
reference mode stays token-identical to transformers' `generate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Llama's norm rounds the normalized activations to their dtype, then multiplies
    by w. With `one_plus` (Gemma's), it multiplies by (1 + w) in float32 and rounds
    after; `weight` is then that float32 multiplier, 1 already added."""

    def __init__(self, weight: torch.Tensor, eps: float, one_plus: bool = False):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.one_plus = one_plus

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.one_plus:
            return (x32 * self.weight).to(dtype)
        return self.weight * x32.to(dtype)


def make_norm(weight: torch.Tensor, eps: float, one_plus: bool, offset_applied: bool, dtype):
    """An RMSNorm from a checkpoint's weight. For (1 + w) norms the multiplier is made
    once here, as transformers makes it at every call (`1.0 + w.float()`); a GGUF
    already holds it (`offset_applied`)."""
    if not one_plus:
        return RMSNorm(weight.to(dtype), eps)
    multiplier = weight.float() if offset_applied else 1.0 + weight.float()
    return RMSNorm(multiplier, eps, one_plus=True)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`[T, 2 * I]` from the fused gate/up projection -> `[T, I]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Gemma's MLP: transformers' `gelu_pytorch_tanh` on gate, times up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}
