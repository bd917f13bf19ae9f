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
class QBlockStrategy:
    """From how many rows of x a q4_1 projection leaves the float block kernel
    (compute/qblock_linear.py), measured per CPU with `python -m bench.qblock_bench`:
    for the VNNI kernel (16-bit activation blocks), and for dequantized chunks into
    torch's float32 GEMM; and from how many rows a BF16 projection (bfloat16-weights)
    multiplies its own rows by torch's bfloat16 GEMM (activations rounded to bfloat16),
    taken only where the CPU has bf16 dot products (has_bf16_dot_products). None:
    never. The defaults are Zen 4's figures, but for the bf16 GEMM: off where the
    crossover was not measured."""

    vnni_from_m: int | None = 16
    dense_from_m: int | None = 48
    bf16_gemm_from_m: int | None = None

    def __post_init__(self):
        for name in ("vnni_from_m", "dense_from_m", "bf16_gemm_from_m"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ValueError(f"{name} must be at least 2 or None, got {value}")


@dataclass(frozen=True)
class MeasuredCpu:
    name: str
    flags: frozenset[str]
    # path -> (GFLOP/s at M=1, GFLOP/s at M=64); None where not measured.
    gflops: dict[str, tuple[float | None, float]]
    source: str
    qblock: QBlockStrategy = QBlockStrategy()

    def score(self, path: str) -> float:
        m1, m64 = self.gflops[path]
        return m64 if m1 is None else math.sqrt(m1 * m64)


# The flags under which torch's bfloat16 GEMM (oneDNN) runs on bf16 dot products
# (vdpbf16ps, AMX tiles) instead of widening to float32 in software.
BF16_DOT_PRODUCT_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def has_bf16_dot_products(flags: frozenset[str]) -> bool:
    return not BF16_DOT_PRODUCT_FLAGS.isdisjoint(flags)


_AVX512_VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
_ZEN4 = _AVX512_VNNI | {"avx512_bf16"}

MEASURED: tuple[MeasuredCpu, ...] = (
    MeasuredCpu(
        name="AMD EPYC, AVX2 and FMA only (Zen 3 class)",
        flags=frozenset({"avx2", "fma"}),
        # bfloat16/float16 are emulated here (6-25x slower than float32: bench/measure_dtype.py).
        gflops={"float32": (12.7, 113.2), "int8": (33.1, 237.2)},
        source="python -m bench.kernel_bench --threads 2, 2 vCPUs, idle, torch 2.13.0, 2026-11-23",
    ),
    MeasuredCpu(
        # Intel's AVX-512 VNNI CPUs without bf16 (Ice Lake, Cascade Lake servers). Zen 4
        # and 5 have these flags too but match their own rows first (one flag more).
        name="Intel Xeon, AVX-512 with VNNI, no bf16 (Ice Lake class)",
        flags=_AVX512_VNNI,
        # 1 thread, the best of several runs (a shared machine: 2-thread runs swung 10x).
        # bfloat16 is emulated here (no avx512_bf16): the path refuses to run. q4_1 leads
        # float32 at M = 1 and M = 64, so it ranks first, int8 aside (fails the gate).
        gflops={
            "float32": (11.0, 111.6),
            "int8": (21.4, 286.1),
            # M = 64 re-measured after the float kernel replaced VNNI below 256 rows (below;
            # it was 79.4 on VNNI): 112.9, beside float32's 98.7 in the same run (load 5).
            "q4_1": (18.2, 112.9),
        },
        # Here the float block kernel (AVX-512) leads the VNNI one at every M up to 128
        # (81 vs 44 GFLOP/s at M = 16, 127 vs 101 at 64, 140 vs 123 at 128; 1 thread,
        # bench.qblock_bench) and ties it at 256-512; the chunked dense GEMM trails both.
        qblock=QBlockStrategy(vnni_from_m=256, dense_from_m=None),
        source="python -m bench.kernel_bench --threads 1 --paths float32,bfloat16,int8,q4_1 "
        "--repeats 10, best of 4 runs, 2 vCPUs (Intel Xeon @ 2.80GHz, Ice Lake: avx512_vnni "
        "avx512_vbmi2, no avx512_bf16, no AMX), load 0.8-2.3, torch 2.13.0, 2026-11-24",
    ),
    MeasuredCpu(
        name="AMD EPYC, AVX-512 with bf16 and VNNI, no AVX-VNNI (Zen 4 class)",
        flags=_ZEN4,
        # The 1-thread figures (a busy shared machine made 2-thread ones swing 5-10x);
        # q4_1's M=64 is its VNNI kernel on 16-bit activation blocks (compute/qblock_linear).
        gflops={
            "float32": (4.9, 45.3),
            "bfloat16": (11.9, 91.8),
            "int8": (43.5, 184.5),
            "q4_1": (26.9, 91.2),
        },
        # BF16 rows on torch's bfloat16 GEMM from 32 rows. Per projection (`python -m
        # bench.micro.bf16_crossover --rounds 5 --repeats 5`, SmolLM2's and Qwen3's layers,
        # hidden 512 and 1024) it leads the float block kernel from M = 12-16 on 1 and 2
        # threads, ~2x at 64. The whole step (`GOMP_SPINCOUNT=10000 python -m
        # bench.micro.bf16_step`, bfloat16 copies of SmolLM2 and a Qwen3 of hidden 512),
        # which the native step leaves to the Python forward from here, in the native
        # step's time: 1 thread 0.79-0.87x at 16 rows, 0.60-0.68x at 64; 2 threads near
        # idle 1.01-1.27x at 16, 0.88-0.96x at 32, 0.70-0.83x at 64; 2 threads beside busy
        # processes (load 4-5 on 2 vCPUs) 1.4-1.6x at 16-32, 0.74-1.13x at 64 (the Python
        # forward's hundreds of parallel regions suffer most from a busy machine). 32:
        # where it leads on the worker's 2 threads.
        qblock=QBlockStrategy(bf16_gemm_from_m=32),
        source="python -m bench.kernel_bench --threads 1 --paths float32,bfloat16,int8,q4_1 "
        "--repeats 15, 2 vCPUs (Zen 4, family 25 model 17), busy, torch 2.13.0, 2026-11-24",
    ),
    MeasuredCpu(
        name="AMD EPYC, AVX-512 with bf16 and VNNI (Zen 5 class)",
        # Zen 5 is told from Zen 4 by AVX-VNNI (the VEX form), which Zen 4 lacks.
        flags=_ZEN4 | {"avx_vnni"},
        # M=64 only: the 120 projections of one step, fbgemm dynamic int8 (issue 12).
        gflops={"float32": (None, 164.0), "bfloat16": (None, 571.0), "int8": (None, 1015.0)},
        source="issue 12's measurement, 2 vCPUs, torch 2.13.0, 2026-11-23",
    ),
)


def closest_measured(flags: frozenset[str]) -> MeasuredCpu | None:
    """The measured CPU with the most flags, all of which this CPU has."""
    matches = [cpu for cpu in MEASURED if cpu.flags <= flags]
    return max(matches, key=lambda cpu: len(cpu.flags), default=None)
