"""sweep.png: the concurrency sweep in two panels, output tok/s and median inter-token
latency against requests in flight, one line per system and prompt length.

A colour per prompt length and a line style per system, so that at one prompt length
the two systems sit side by side in one colour. Both axes are logarithmic: the
concurrencies grow by 4x steps and throughput and latency span orders of magnitude.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.harness.plots import MISSING, pyplot

STYLES = {"cbserve": ("-", "o"), "llamacpp": ("--", "s")}
NAMES = {"cbserve": "cbserve", "llamacpp": "llama.cpp"}


def curves(points) -> dict[tuple[str, int], list[tuple[int, float, float]]]:
    """(system, prompt_len) -> [(concurrency, output tok/s, median ITL ms)], in order.
    Points whose requests all failed have no throughput to draw and are left out."""
    lines: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for p in points:
        if p.completed:
            key = (p.system, p.prompt_len)
            lines.setdefault(key, []).append((p.concurrency, p.output_throughput, p.itl_median_ms))
    return {key: sorted(values) for key, values in lines.items()}


def write(path: Path, points, subtitle: str = "") -> list[Path]:
    plt = pyplot()
    if plt is None:
        print(MISSING, file=sys.stderr)
        return []
    lines = curves(points)
    if not lines:
        return []
    prompt_lens = sorted({prompt_len for _, prompt_len in lines})
    colours = {
        n: plt.cm.viridis(i / max(1, len(prompt_lens) - 1) * 0.85)
        for i, n in enumerate(prompt_lens)
    }
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for (system, prompt_len), values in sorted(lines.items()):
        style, marker = STYLES.get(system, (":", "^"))
        drawn = dict(color=colours[prompt_len], linestyle=style, marker=marker)
        label = f"{NAMES.get(system, system)}, {prompt_len}-token prompts"
        xs = [v[0] for v in values]
        left.plot(xs, [v[1] for v in values], label=label, **drawn)
        right.plot(xs, [v[2] for v in values], label=label, **drawn)
    concurrencies = sorted({p.concurrency for p in points})
    for axes, ylabel, title in (
        (left, "output throughput (tok/s)", "Output throughput"),
        (right, "median inter-token latency (ms)", "Inter-token latency"),
    ):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        # Plain numbers (150, not 1.5x10^2) on the log axis, minor ticks included.
        plain = plt.FuncFormatter(lambda value, _: f"{value:g}")
        axes.yaxis.set_major_formatter(plain)
        axes.yaxis.set_minor_formatter(plain)
        axes.tick_params(axis="y", which="minor", labelsize="x-small")
        axes.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axes.set_xlabel("requests in flight (concurrency)")
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
    left.legend(fontsize="small")
    if subtitle:
        figure.suptitle(subtitle, fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return [path]
