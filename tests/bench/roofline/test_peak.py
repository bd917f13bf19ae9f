"""bench.roofline.peak: a loop the CPU runs gives a rate; one it lacks gives none."""

from __future__ import annotations

import pytest

from bench.roofline.peak import INSTRUCTIONS, load_peak_loop, measure_peak, measure_rate, run_loop
from worker_svc.compute.cpu_features import cpu_flags

AVX2_ONLY = frozenset({"avx", "avx2", "fma", "sse4_2"})


def _fma_here():
    """The FMA loop this CPU runs (every x86 CPU the worker is built for has one)."""
    for name in ("fma-zmm", "fma-ymm"):
        if not INSTRUCTIONS[name].missing(cpu_flags()):
            return INSTRUCTIONS[name]
    pytest.fail(f"this CPU has no AVX2 FMA nor AVX-512: {sorted(cpu_flags())[:20]}")


def test_an_instruction_the_cpu_lacks_is_absent_and_never_timed():
    for name in ("vpdpbusd", "vpdpwssd", "vdpbf16ps", "fma-zmm"):
        result = measure_peak(INSTRUCTIONS[name], AVX2_ONLY, threads=2)
        assert result.one_thread is None and result.all_threads is None
        assert result.absent.startswith("this CPU lacks") and "avx512f" in result.absent
    assert INSTRUCTIONS["vdpbf16ps"].missing(AVX2_ONLY) == ("avx512f", "avx512_bf16")


def test_the_fma_loop_runs_on_one_thread_and_counts_its_macs():
    instruction = _fma_here()
    lib = load_peak_loop(instruction.name)
    assert lib.roofline_instructions_per_iteration() == 12
    ran, short = run_loop(lib, 1, 1 << 12)
    ran_long, long = run_loop(lib, 1, 1 << 18)
    assert ran == ran_long == 1
    # The loop is the work: 64 times the iterations take clearly longer (not folded away).
    assert long > 8 * short > 0


def test_the_fma_peak_is_a_positive_rate_with_best_at_least_median():
    rate = measure_rate(_fma_here(), threads=1, repeats=3, seconds_per_run=0.01)
    assert rate.threads == 1
    # At least a vector FMA every 50 cycles of a 5 GHz clock: any CPU, however busy.
    assert rate.best_macs >= rate.median_macs > 8 * 5e9 / 50
