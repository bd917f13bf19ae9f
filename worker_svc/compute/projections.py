"""The projection class for a compute path (see compute.paths): one factory, apart from
the classes it chooses between, so that no projection module imports another's."""

from __future__ import annotations

import torch

from worker_svc.compute.linear import DenseLinear, Int8Linear, Projection
from worker_svc.compute.paths import PATHS


def make_projection(
    weight: torch.Tensor, path: str, bias: torch.Tensor | None = None
) -> Projection:
    """`y = x @ weight.T (+ bias)` on the compute path named `path`."""
    if path == "int8":
        return Int8Linear(weight, bias)
    if path == "q4_1":
        from worker_svc.compute.qblock import Q4_1
        from worker_svc.compute.qblock_linear import QBlockLinear

        return QBlockLinear.from_float(weight, Q4_1, bias=bias)
    return DenseLinear(weight, PATHS[path].activation_dtype, bias)
