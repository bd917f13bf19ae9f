"""PNG plots of a benchmark run, when matplotlib is installed.

- throughput.png: output token throughput against request rate, one line per system
  (only when several finite rates were run: one point is not a curve);
- ttft.png and itl.png: the distributions (empirical CDFs) of TTFT and ITL for every
  run, which show the tails a mean and a p99 hide.
matplotlib is optional: without it, plotting is skipped with one message and the
table and JSON are still written.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

MISSING = "plots skipped: matplotlib is not installed (.venv/bin/pip install matplotlib)"


def pyplot():
    """matplotlib's pyplot, drawing to files only; None where matplotlib is missing.
    Every benchmark's plots (this run's, the sweep's, the scheduler's) start here."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _cdf(axes, values_ms: list[float], label: str) -> None:
    # A log axis cannot show 0 (two messages in one read): those are left out.
    shown = [value for value in values_ms if value > 0]
    if shown:
        axes.ecdf(shown, label=f"{label} (n={len(shown)})")


def throughput_vs_rate(curves: dict[str, list[tuple[float, float]]], path: Path, plt) -> bool:
    """curves: system -> [(request rate, output tok/s)]; infinite rates are left out."""
    finite = {
        system: sorted(p for p in points if not math.isinf(p[0]))
        for system, points in curves.items()
    }
    if max((len(points) for points in finite.values()), default=0) < 2:
        return False
    figure, axes = plt.subplots(figsize=(6, 4))
    for system, points in finite.items():
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
    axes.set_xlabel("request rate (req/s)")
    axes.set_ylabel("output throughput (tok/s)")
    axes.set_title("Output throughput against offered load")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def distribution(samples: dict[str, list[float]], title: str, path: Path, plt) -> bool:
    """samples: run label -> values in milliseconds."""
    if not any(samples.values()):
        return False
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, values in samples.items():
        _cdf(axes, values, label)
    axes.set_xscale("log")
    axes.set_xlabel(f"{title} (ms, log scale)")
    axes.set_ylabel("fraction of samples at or below")
    axes.set_title(f"{title} distribution")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_plots(
    out_dir: Path,
    curves: dict[str, list[tuple[float, float]]],
    ttfts_ms: dict[str, list[float]],
    itls_ms: dict[str, list[float]],
) -> list[Path]:
    """Writes what applies; returns the files written. Prints why when it cannot."""
    plt = pyplot()
    if plt is None:
        print(MISSING, file=sys.stderr)  # stdout carries only the table
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    jobs = [
        (out_dir / "throughput.png", lambda p: throughput_vs_rate(curves, p, plt)),
        (out_dir / "ttft.png", lambda p: distribution(ttfts_ms, "TTFT", p, plt)),
        (out_dir / "itl.png", lambda p: distribution(itls_ms, "ITL", p, plt)),
    ]
    for path, draw in jobs:
        if draw(path):
            written.append(path)
    return written
