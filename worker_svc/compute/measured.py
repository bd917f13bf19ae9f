"""Projection GFLOP/s per compute path, measured on the CPUs the project has run on.

Each entry: the flags that identify the CPU class, and `python -m bench.kernel_bench`'s
whole-step figures (the model's 120 projections plus the LM head) at M=1 (one
stream) and M=64 (64 decodes a step). selection.path_order ranks a class's paths by
the geometric mean of the two, so that neither the single stream nor the full batch
is given up for the other. Add a row when the project meets a new CPU class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredCpu:
    name: str
    flags: frozenset[str]
    # path -> (GFLOP/s at M=1, GFLOP/s at M=64); None where not measured.
    gflops: dict[str, tuple[float | None, float]]
    source: str

    def score(self, path: str) -> float:
        m1, m64 = self.gflops[path]
        return m64 if m1 is None else math.sqrt(m1 * m64)


MEASURED: tuple[MeasuredCpu, ...] = ()
