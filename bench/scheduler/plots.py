"""PNG plots of a scheduler benchmark run (bench/scheduler/run.py), beside its table.

- throughput.png: output tok/s at the clients per load and front, against what the
  workers could make (a marker; none where the workers have no step time);
- cpu.png: the scheduler's CPU seconds per 1k streamed tokens per load and front,
  against the bare streaming server's CPU per 1k messages at the same streams.
Skipped (an empty list) without matplotlib, as bench/harness/plots.py does.
"""

from __future__ import annotations

import math
from pathlib import Path

from bench.harness.plots import MISSING, pyplot
from bench.scheduler.report import BARE, Measurement, floor_for


def _grouped(rows: list[Measurement]) -> tuple[list[str], list[str]]:
    loads = list(dict.fromkeys(row.load.spec for row in rows if row.front != BARE))
    fronts = list(dict.fromkeys(row.front for row in rows if row.front != BARE))
    return loads, fronts


def _find(rows: list[Measurement], spec: str, front: str) -> Measurement | None:
    return next((r for r in rows if r.load.spec == spec and r.front == front), None)


def _bars(axes, loads, series: dict[str, list[float]]) -> None:
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series.items()):
        offsets = [x + (index - (len(series) - 1) / 2) * width for x in range(len(loads))]
        shown = [0.0 if math.isnan(v) else v for v in values]
        axes.bar(offsets, shown, width, label=name)
    axes.set_xticks(range(len(loads)), loads, rotation=20)
    axes.set_xlabel("load: workers x step ms : streams")
    axes.grid(True, axis="y", alpha=0.3)
    axes.margins(y=0.3)  # room above the bars for the legend


def throughput(rows: list[Measurement], path: Path, plt) -> None:
    loads, fronts = _grouped(rows)
    figure, axes = plt.subplots(figsize=(8, 4.5))
    series = {
        f"clients, {front}": [
            row.tok_s if (row := _find(rows, spec, front)) else math.nan for spec in loads
        ]
        for front in fronts
    }
    _bars(axes, loads, series)
    capacity = [next(r for r in rows if r.load.spec == s).load.capacity_tok_s for s in loads]
    finite = [(x, c) for x, c in enumerate(capacity) if math.isfinite(c)]
    if finite:
        axes.scatter(
            *zip(*finite, strict=True), marker="_", s=600, c="k", label="workers could make"
        )
    axes.set_ylabel("output tok/s")
    axes.set_title("Output tokens/s at the clients, null workers")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def cpu(rows: list[Measurement], path: Path, plt) -> None:
    loads, fronts = _grouped(rows)
    series = {
        f"scheduler, {front} (per token)": [
            row.server_cpu_per_1k if (row := _find(rows, spec, front)) else math.nan
            for spec in loads
        ]
        for front in fronts
    }
    floors = []
    for spec in loads:
        streams = next(r for r in rows if r.load.spec == spec).load.streams
        floor = floor_for(rows, streams)
        floors.append(floor.server_cpu_per_1k if floor else math.nan)
    if not all(math.isnan(v) for v in floors):
        series["bare grpc.aio server (per message)"] = floors
    figure, axes = plt.subplots(figsize=(8, 4.5))
    _bars(axes, loads, series)
    axes.set_ylabel("CPU seconds per 1k streamed tokens")
    axes.set_title("Server CPU per streamed token")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_plots(rows: list[Measurement], out_dir: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        print(MISSING)
        return []
    if not any(row.front != BARE for row in rows):
        return []
    paths = [out_dir / "throughput.png", out_dir / "cpu.png"]
    throughput(rows, paths[0], plt)
    cpu(rows, paths[1], plt)
    return paths
