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


MEASURED: tuple[MeasuredCpu, ...] = (
    MeasuredCpu(
        name="AMD EPYC, AVX2 and FMA only (Zen 3 class)",
        flags=frozenset({"avx2", "fma"}),
        # bfloat16/float16 are emulated here (6-25x slower than float32: bench/measure_dtype.py).
        gflops={"float32": (12.7, 113.2), "int8": (33.1, 237.2)},
        source="python -m bench.kernel_bench --threads 2, 2 vCPUs, idle, torch 2.13.0, 2026-11-23",
    ),
    MeasuredCpu(
        name="AMD EPYC, AVX-512 with bf16 and VNNI (Zen 5 class)",
        flags=frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"}),
        # M=64 only: the 120 projections of one step, fbgemm dynamic int8 (issue 12).
        gflops={"float32": (None, 164.0), "bfloat16": (None, 571.0), "int8": (None, 1015.0)},
        source="issue 12's measurement, 2 vCPUs, torch 2.13.0, 2026-11-23",
    ),
)
