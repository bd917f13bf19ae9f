"""Rotary tables by position, one per distinct RopeSpec of a model (Gemma 3 has two:
10k for its sliding layers, 1M for its global ones).

The frequencies are computed as transformers computes them, in the same float32
operations, so that the float32 reference stays token-identical: the default
`1 / theta ** (2i / d)`, linear scaling (frequencies divided by the factor), Llama
3.1's scaling (long wavelengths divided by the factor, short ones kept, the band
between blended by wavelength), and YaRN (gpt-oss: the same idea with the band set by
rotation counts and a linear ramp over dimensions, and cos/sin scaled by its
attention factor).
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
    if spec.kind == "yarn":
        return _yarn_scaled(spec, head_dim)
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


def _yarn_correction_range(spec: RopeSpec, dim: int) -> tuple[float, float]:
    """The dimensions (in pairs) where beta_fast and beta_slow rotations over the original
    length fall: below the first frequencies are kept, past the second slowed."""

    def dimension_of(rotations: float) -> float:
        turns = spec.original_max_positions / (rotations * 2 * math.pi)
        return (dim * math.log(turns)) / (2 * math.log(spec.theta))

    low, high = dimension_of(spec.beta_fast), dimension_of(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_scaled(spec: RopeSpec, dim: int) -> torch.Tensor:
    """transformers' _compute_yarn_parameters, operation for operation in float32."""
    pos_freqs = spec.theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (spec.factor * pos_freqs)
    low, high = _yarn_correction_range(spec, dim)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    kept = 1 - ramp
    return interpolation * (1 - kept) + extrapolation * kept


def cos_sin_scale(spec: RopeSpec) -> float:
    """What the cos and sin tables are multiplied by: YaRN's attention factor, by default
    0.1 * ln(factor) + 1 as the paper (and transformers) suggest; 1 for other kinds."""
    if spec.kind != "yarn":
        return 1.0
    if spec.attention_factor is not None:
        return spec.attention_factor
    return 0.1 * math.log(spec.factor) + 1.0 if spec.factor > 1 else 1.0


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
        cos, sin = freqs.cos(), freqs.sin()
        scale = cos_sin_scale(spec)
        if scale != 1.0:  # YaRN's attention factor, applied as transformers applies it
            cos, sin = cos * scale, sin * scale
        self.register_buffer("cos", cos.to(dtype), persistent=False)
        self.register_buffer("sin", sin.to(dtype), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin rows `[T, 1, d/2]` for a step's positions: once a step, for every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[T, heads, d]` (any number of heads: q and k rotate in one call)."""
    x1, x2 = x.chunk(2, dim=-1)
    # transformers' q * cos + rotate_half(q) * sin, halves written out: the same
    # products and sums, so float32 results are bit-equal.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
