"""Rotary tables by position, one per distinct RopeSpec of a model (Gemma 3 has two:
10k for its sliding layers, 1M for its global ones).

The frequencies are computed as transformers computes them, in the same float32
operations, so that the float32 reference stays token-identical: the default
`1 / theta ** (2i / d)`, linear scaling (frequencies divided by the factor), and Llama
3.1's scaling (long wavelengths divided by the factor, short ones kept, the band
between blended by wavelength).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worker_svc.models.declaration import RopeSpec


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (spec.theta**exponents)
    if spec.kind == "linear":
        return inv_freq / spec.factor
    if spec.kind == "llama3":
        return _llama3_scaled(inv_freq, spec)
    if spec.kind == "factors":
        if len(spec.factors) != len(inv_freq):
            raise ValueError(f"{len(spec.factors)} rope factors for {len(inv_freq)} frequencies")
        return inv_freq / torch.tensor(spec.factors, dtype=torch.float32)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Wavelengths past original/low_freq_factor are slowed by `factor`; those under
    original/high_freq_factor are kept; in between, a linear blend in 1/wavelength."""
    low_wavelength = spec.original_max_positions / spec.low_freq_factor
    high_wavelength = spec.original_max_positions / spec.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > low_wavelength, inv_freq / spec.factor, inv_freq)
    blend = (spec.original_max_positions / wavelength - spec.low_freq_factor) / (
        spec.high_freq_factor - spec.low_freq_factor
    )
    blended = (1 - blend) * slowed / spec.factor + blend * slowed
    in_band = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(in_band, blended, slowed)


class RotaryEmbedding(nn.Module):
    """RoPE by position: cos/sin rows are looked up from a table built once.

    The table covers the model's whole length, so a step only indexes it with its
    positions tensor; a flat batch mixes many sequences, each at its own offset.
    """

    def __init__(self, head_dim: int, max_positions: int, spec: RopeSpec, dtype: torch.dtype):
        super().__init__()
        inv_freq = inverse_frequencies(spec, head_dim)
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
