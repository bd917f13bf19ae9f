"""Projections (`y = x @ W.T + b`) in the precisions a compute path may use.

Each class is built once from a float32 weight `[out, in]` (and, for Qwen2's q/k/v, a
bias `[out]`) and called on the flat batch `[T, in]`. compute.projections picks the
class for a compute path.
"""

from __future__ import annotations

import itertools
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn


class Projection(nn.Module):
    """Base: keeps the shape for FLOP counts and reports."""

    out_features: int
    in_features: int

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"


class DenseLinear(Projection):
    """float32, bfloat16 or float16 weights, activations in the same dtype."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.to(dtype).contiguous(), requires_grad=False)
        # F.linear with its bias, as transformers calls it: one rounding less than a sum.
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


# Weights use 7 of their 8 bits so that activations can use all 8: AVX2's vpmaddubsw
# adds two u8 x s8 products into a saturating int16, and 2 x 255 x 63 stays below
# 32767. The usual choice (torch's reduce_range) halves the activations' levels
# instead, and activations, not the per-channel weights, are where int8 loses
# precision in these models.
WEIGHT_LEVELS = 63.0


class Int8Linear(Projection):
    """int8 weights (one scale per output channel) times int8 activations (one scale per
    token), accumulated in int32 by fbgemm, whose kernels use the CPU's 8-bit dot
    products (VNNI, AMX, or AVX2's vpmaddubsw).

    fbgemm's dynamic op quantizes its input with one scale for the whole tensor. Each
    row is first divided by its own absolute maximum, so that the tensor-wide scale is
    in effect a per-token one, and the output rows are multiplied back: with no bias,
    `linear(x / s, W) * s == linear(x, W)` row by row. One outlier token then costs
    precision to itself only, not to the batch it shares a step with.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # Added after the row scales are multiplied back, which a bias inside would break.
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)
        weight = weight.float()
        scales = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp(min=1e-12)
        with warnings.catch_warnings():
            # torch marks its quantized tensor type deprecated; fbgemm's packed weights
            # are still built from it. A torch that drops it fails here, at load.
            warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
            quantized = torch.quantize_per_channel(
                weight, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
        self._packed = torch.ops.quantized.linear_prepack(quantized, None)
        self._handle = next(_HANDLES)
        _INT8_LINEARS[self._handle] = self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            # One token: the tensor-wide scale already is its own (a single stream's
            # decode), and five small operators a projection are worth saving there.
            out = self._matmul(x)
        else:
            row_max = x.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12)
            out = self._matmul(x / row_max).mul_(row_max)
        return out if self.bias is None else out.add_(self.bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # torch.compile cannot trace fbgemm's packed weights (a TorchScript
            # object): the graph names them by handle through an opaque op.
            return torch.ops.cbserve.int8_linear(x, self._handle)
        return torch.ops.quantized.linear_dynamic(x, self._packed, False)


# Handle -> projection, for the op below; weak, so a dropped model frees its weights.
_INT8_LINEARS: weakref.WeakValueDictionary[int, Int8Linear] = weakref.WeakValueDictionary()
_HANDLES = itertools.count()


@torch.library.custom_op("cbserve::int8_linear", mutates_args=())
def _int8_linear_op(x: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, _INT8_LINEARS[handle]._packed, False)


@_int8_linear_op.register_fake
def _(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], _INT8_LINEARS[handle].out_features))
