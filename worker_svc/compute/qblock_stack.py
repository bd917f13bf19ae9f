"""A fused projection whose row ranges keep their own block formats.

A Q4_K_M file stores q and k in Q4_K and v in Q6_K; the own forward fuses them into
one QKV projection. Requantizing the three to one format would change the file's
weights, so the fused projection is kept as the runs of rows the file has: one
QBlockLinear per run, each with its own format and blocks, their outputs side by side
in the fused output's columns. The native decode step reads the same runs
(`block_runs`, models/qblock/native.py), so both paths multiply by the file's weights.
"""

from __future__ import annotations

import torch
from torch import nn

from worker_svc.compute.linear import Projection
from worker_svc.compute.qblock import BlockFormat
from worker_svc.compute.qblock_linear import QBlockLinear


class QBlockStack(Projection):
    """y = x @ W.T + b, W's rows given as runs `[QBlockLinear, ...]` (no biases of their
    own), stacked in that order."""

    def __init__(self, runs: list[QBlockLinear], bias: torch.Tensor | None = None):
        super().__init__()
        if len(runs) < 2:
            raise ValueError("a stack takes two runs or more: one run is a QBlockLinear")
        if len({run.in_features for run in runs}) != 1 or any(r.bias is not None for r in runs):
            raise ValueError("the runs must share K and carry no bias")
        self.runs = nn.ModuleList(runs)
        self.in_features = runs[0].in_features
        self.out_features = sum(run.out_features for run in runs)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    @property
    def formats(self) -> tuple[BlockFormat, ...]:
        return tuple(run.format for run in self.runs)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight the runs multiply by (for tests and references)."""
        return torch.cat([run.dequantized() for run in self.runs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([run(x) for run in self.runs], dim=1)
        return out if self.bias is None else out.add_(self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, formats={'+'.join(f.name for f in self.formats)}"


def block_runs(projection: QBlockLinear | QBlockStack) -> list[QBlockLinear]:
    """A block projection's runs of rows, one for a QBlockLinear."""
    return list(projection.runs) if isinstance(projection, QBlockStack) else [projection]


def qblock_projection(
    runs: list[tuple[torch.Tensor, BlockFormat, int]], bias: torch.Tensor | None = None, **kwargs
) -> QBlockLinear | QBlockStack:
    """A QBlockLinear for one run of blocks `(blocks, format, K)`, else a QBlockStack of
    them; `kwargs` go to every QBlockLinear (its M thresholds)."""
    if len(runs) == 1:
        return QBlockLinear(*runs[0], bias=bias, **kwargs)
    return QBlockStack([QBlockLinear(*run, **kwargs) for run in runs], bias=bias)
