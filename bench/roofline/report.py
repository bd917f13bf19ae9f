"""What the roofline counts and prints: FLOPs per call, rates against a peak, the table
and the JSON. Pure: numbers in, text and dicts out (tests/bench/roofline/).

A multiply-accumulate is two operations, as every GFLOP/s figure in bench/ counts them
(2 M N K for a matmul), so a peak in MAC/s is printed as twice that in
"GFLOP/s-equivalent" and an achieved GFLOP/s divides by it directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the peak module builds C with torch loaded; this one stays pure
    from bench.roofline.peak import PeakResult


def matmul_flops(rows: int, out_features: int, in_features: int) -> float:
    """x `[rows, in]` @ W.T, W `[out, in]`: one multiply and one add per weight and row."""
    return 2.0 * rows * out_features * in_features


def attention_flops(context_lens: list[int], heads: int, head_dim: int) -> float:
    """Decode attention: per query head and key, q.k and the weighted sum of v, each one
    multiply-add per element of head_dim (the softmax's exps are not counted)."""
    return 4.0 * heads * head_dim * sum(context_lens)


def attention_kv_bytes(
    context_lens: list[int], kv_heads: int, head_dim: int, element_bytes: int
) -> float:
    """The K and V a decode step must read at least once: every cached key and value."""
    return 2.0 * sum(context_lens) * kv_heads * head_dim * element_bytes


@dataclass(frozen=True)
class Achieved:
    """One timed thing: a path's projections of a step at `rows`, or attention."""

    what: str  # e.g. "q4_1 (GGUF blocks)", "attention (float16 pool)"
    rows: int  # M: rows of x, or sequences for attention
    kernel: str  # the kernel that ran, e.g. "VNNI kernel"
    instruction: str | None  # the peak it is measured against (a peak.INSTRUCTIONS name)
    flops: float  # per step
    median_seconds: float
    best_seconds: float
    bytes_read: float | None = None  # per step, where a memory figure is meaningful
    shapes_gflops: dict[str, float] = field(default_factory=dict)  # per projection, median

    def __post_init__(self):
        if self.flops <= 0 or not 0 < self.best_seconds <= self.median_seconds:
            raise ValueError(f"{self.what}: needs FLOPs and 0 < best <= median seconds")

    @property
    def gflops(self) -> float:
        return self.flops / self.median_seconds / 1e9

    @property
    def best_gflops(self) -> float:
        return self.flops / self.best_seconds / 1e9


def peak_gflops(peak: PeakResult | None) -> float | None:
    """The GFLOP/s-equivalent a kernel is held to: the best run on all threads."""
    if peak is None or peak.all_threads is None:
        return None
    return 2.0 * peak.all_threads.best_macs / 1e9


def fraction_of_peak(row: Achieved, peaks: dict[str, PeakResult]) -> float | None:
    """The row's median GFLOP/s over its instruction's peak; None where there is none."""
    limit = peak_gflops(peaks.get(row.instruction)) if row.instruction else None
    return None if not limit else row.gflops / limit


def peak_lines(peaks: dict[str, PeakResult], threads: int) -> list[str]:
    lines = [
        f"peak per instruction, GMAC/s best (median); all = {threads} threads; "
        "GFLOP/s-eq = 2 x all threads' best",
        f"{'instruction':11s} {'what':31s} {'one thread':>15s} {'all threads':>15s} "
        f"{'GFLOP/s-eq':>10s}",
    ]
    for name, peak in peaks.items():
        head = f"{name:11s} {peak.instruction.what:31s}"
        if peak.absent:
            lines.append(f"{head} absent: {peak.absent}")
            continue
        one, every = peak.one_thread, peak.all_threads
        cells = [
            f"{rate.best_macs / 1e9:6.1f} ({rate.median_macs / 1e9:6.1f})" for rate in (one, every)
        ]
        lines.append(f"{head} {cells[0]:>15s} {cells[1]:>15s} {peak_gflops(peak):10.1f}")
    return lines


def achieved_lines(rows: list[Achieved], peaks: dict[str, PeakResult]) -> list[str]:
    shape_names = list(dict.fromkeys(name for row in rows for name in row.shapes_gflops))
    lines = [
        "achieved, GFLOP/s median (best), against the all-threads peak of the instruction "
        "the kernel uses; per-projection columns GFLOP/s median",
        f"{'what':26s} {'M':>3s} {'kernel':24s} {'vs':9s} {'GFLOP/s':>15s} {'of peak':>7s} "
        f"{'GB/s':>6s}  " + " ".join(f"{name:>7s}" for name in shape_names),
    ]
    for row in rows:
        share = fraction_of_peak(row, peaks)
        cells = [f"{row.gflops:6.1f} ({row.best_gflops:6.1f})"]
        cells.append(f"{share:6.1%}" if share is not None else f"{'-':>7s}")
        cells.append(
            f"{row.bytes_read / row.median_seconds / 1e9:6.1f}" if row.bytes_read else f"{'':6s}"
        )
        shapes = " ".join(
            f"{row.shapes_gflops[n]:7.1f}" if n in row.shapes_gflops else f"{'':7s}"
            for n in shape_names
        )
        lines.append(
            f"{row.what:26s} {row.rows:3d} {row.kernel:24s} {row.instruction or '-':9s} "
            f"{cells[0]:>15s} {cells[1]:>7s} {cells[2]}  {shapes}".rstrip()
        )
    return lines


def peak_json(peak: PeakResult) -> dict:
    out = {"instruction": peak.instruction.name, "what": peak.instruction.what}
    out["macs_per_instruction"] = peak.instruction.macs_per_instruction
    if peak.absent:
        return {**out, "absent": peak.absent}
    for key, rate in (("one_thread", peak.one_thread), ("all_threads", peak.all_threads)):
        out[key] = {
            **asdict(rate),
            "best_gflops_equivalent": 2.0 * rate.best_macs / 1e9,
            "median_gflops_equivalent": 2.0 * rate.median_macs / 1e9,
        }
    return out


def achieved_json(row: Achieved, peaks: dict[str, PeakResult]) -> dict:
    out = asdict(row)
    out["gflops"], out["best_gflops"] = row.gflops, row.best_gflops
    out["fraction_of_peak"] = fraction_of_peak(row, peaks)
    out["peak_gflops_equivalent"] = peak_gflops(peaks.get(row.instruction))
    out["bytes_per_second"] = row.bytes_read / row.median_seconds if row.bytes_read else None
    return out


def roofline_json(
    header: dict, peaks: dict[str, PeakResult], rows: list[Achieved], skipped: list[str]
) -> dict:
    """Everything the run measured, with `header` (CPU, threads, command) first."""
    return {
        **header,
        "peaks": [peak_json(peak) for peak in peaks.values()],
        "achieved": [achieved_json(row, peaks) for row in rows],
        "not_timed": skipped,
    }
