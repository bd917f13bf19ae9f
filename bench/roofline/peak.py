"""The measured peak of each multiply-accumulate instruction the kernels use, on this CPU.

Each instruction's loop (peak_loop.c) is its own library, built at run time by the
worker's builder (worker_svc/native_build.py) with only the -m flags it needs, and
loaded after torch so its OpenMP binds to the libgomp torch's threads use. An
instruction whose flags /proc/cpuinfo lacks is reported absent: never built, never
emulated, never given a number.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
from dataclasses import dataclass
from pathlib import Path

from worker_svc.native_build import KernelUnavailableError, build_and_load_parts

SOURCE = Path(__file__).with_name("peak_loop.c")
# -O2 and no -ffast-math: the loop is the intrinsics as written, in program order.
BASE_FLAGS = ("-O2", "-fopenmp", "-fPIC", "-std=gnu11")
LINK_FLAGS = ("-shared", "-fopenmp")
# Short runs, many of them: a run shorter than the scheduler's time slice is seldom cut
# by another process, so on a shared machine the best of them is the core's own rate
# (runs of 50 ms measured two thirds of it beside a busy neighbour; runs of 3 ms all).
SECONDS_PER_RUN = 0.004
# The loop's inputs: small, so float sums stay normal numbers through any run length.
SEEDS = (ctypes.c_float * 2)(1e-3, 1e-3)


@dataclass(frozen=True)
class PeakInstruction:
    name: str  # the instruction as a roofline row names it
    what: str
    define: str  # the macro that selects it in peak_loop.c
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags it needs, all of them
    machine_flags: tuple[str, ...]  # the compiler's -m flags for it
    macs_per_instruction: int  # multiply-accumulates one instruction does

    def __post_init__(self):
        if self.macs_per_instruction <= 0 or not self.cpu_flags:
            raise ValueError(f"{self.name}: needs MACs per instruction and CPU flags")

    def missing(self, flags: frozenset[str]) -> tuple[str, ...]:
        return tuple(flag for flag in self.cpu_flags if flag not in flags)


INSTRUCTIONS = {
    i.name: i
    for i in (
        PeakInstruction(
            "vpdpbusd", "u8*s8 -> s32, AVX-512 VNNI", "PEAK_VPDPBUSD",
            ("avx512f", "avx512_vnni"), ("-mavx512f", "-mavx512vnni"), 64,
        ),
        PeakInstruction(
            "vpdpwssd", "s16*s16 -> s32, AVX-512 VNNI", "PEAK_VPDPWSSD",
            ("avx512f", "avx512_vnni"), ("-mavx512f", "-mavx512vnni"), 32,
        ),
        PeakInstruction(
            "vdpbf16ps", "bf16*bf16 -> f32, AVX-512 BF16", "PEAK_VDPBF16PS",
            ("avx512f", "avx512_bf16"), ("-mavx512f", "-mavx512bf16"), 32,
        ),
        PeakInstruction(
            "fma-zmm", "vfmadd231ps zmm, f32", "PEAK_FMA_ZMM",
            ("avx512f",), ("-mavx512f",), 16,
        ),
        PeakInstruction(
            "fma-ymm", "vfmadd231ps ymm, f32", "PEAK_FMA_YMM",
            ("avx2", "fma"), ("-mavx2", "-mfma"), 8,
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class PeakRate:
    """One instruction's rate on some threads; `best` and `median` MAC/s over repeats."""

    threads: int
    best_macs: float
    median_macs: float


@dataclass(frozen=True)
class PeakResult:
    instruction: PeakInstruction
    absent: str | None = None  # why there is no figure: the CPU lacks it, or no build
    one_thread: PeakRate | None = None
    all_threads: PeakRate | None = None


@functools.cache
def load_peak_loop(name: str) -> ctypes.CDLL:
    """The loop library for one instruction; KernelUnavailableError says why not."""
    instruction = INSTRUCTIONS[name]
    flags = (*BASE_FLAGS, f"-D{instruction.define}", *instruction.machine_flags)
    lib = build_and_load_parts(
        f"roofline_{instruction.define.lower()}", ((SOURCE, flags),), LINK_FLAGS
    )
    lib.roofline_peak.restype = ctypes.c_int
    lib.roofline_peak.argtypes = [
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_double),
        ctypes.POINTER(ctypes.c_double),
    ]
    lib.roofline_instructions_per_iteration.restype = ctypes.c_int
    return lib


def run_loop(lib: ctypes.CDLL, threads: int, iterations: int) -> tuple[int, float]:
    """(threads that ran, seconds) of one timed run of the loop."""
    seconds, sink = ctypes.c_double(), ctypes.c_double()
    ran = lib.roofline_peak(
        threads, iterations, ctypes.addressof(SEEDS), ctypes.byref(seconds), ctypes.byref(sink)
    )
    return ran, seconds.value


def measure_rate(
    instruction: PeakInstruction, threads: int, repeats: int, seconds_per_run: float
) -> PeakRate:
    """MAC/s of the loop on `threads` threads, `repeats` runs. Each thread runs the
    iterations one thread does in about `seconds_per_run` (sized on one thread: a
    parallel run's start waits for every thread to be scheduled, which on a busy
    machine can take longer than a short loop; the sizing runs also warm the clocks).
    A size is judged by the faster of two runs, so that one run another process held
    up does not leave the timed runs too short to time."""
    lib = load_peak_loop(instruction.name)
    per_iteration = lib.roofline_instructions_per_iteration() * instruction.macs_per_instruction
    iterations = 1 << 14
    while True:
        elapsed = min(run_loop(lib, 1, iterations)[1] for _ in range(2))
        if elapsed >= seconds_per_run / 4 or iterations >= 1 << 40:
            break
        iterations *= 4
    iterations = max(1, int(iterations * seconds_per_run / max(elapsed, 1e-9)))
    rates, ran = [], threads
    for _ in range(repeats):
        ran, elapsed = run_loop(lib, threads, iterations)
        rates.append(ran * iterations * per_iteration / elapsed)
    return PeakRate(ran, max(rates), statistics.median(rates))


def measure_peak(
    instruction: PeakInstruction,
    flags: frozenset[str],
    threads: int,
    repeats: int = 20,
    seconds_per_run: float = SECONDS_PER_RUN,
) -> PeakResult:
    """The instruction's peak on one thread and on `threads`, or why it has none."""
    missing = instruction.missing(flags)
    if missing:
        return PeakResult(instruction, absent=f"this CPU lacks {', '.join(missing)}")
    try:
        load_peak_loop(instruction.name)
    except KernelUnavailableError as exc:
        return PeakResult(instruction, absent=f"not built: {exc}")
    one = measure_rate(instruction, 1, repeats, seconds_per_run)
    every = one if threads == 1 else measure_rate(instruction, threads, repeats, seconds_per_run)
    return PeakResult(instruction, one_thread=one, all_threads=every)
