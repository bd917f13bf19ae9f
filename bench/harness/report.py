"""How results are shown: one markdown table (a column per run, ratio columns beside
them) and one JSON file.

A ratio column compares cbserve with a baseline on the same prompts and arrivals. It
reads "times better": throughput divided by the baseline's throughput, and the
baseline's latency divided by cbserve's, so every ratio above 1 means cbserve wins
by that factor (the issue's targets are all of that form: "2x the throughput",
"a median TTFT 5x lower").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# (summary key, row label); latencies are expanded per statistic below.
COUNTS = [
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("duration_s", "Duration (s)"),
    ("total_input_tokens", "Total input tokens"),
    ("total_output_tokens", "Total output tokens"),
    ("preemptions", "Preemptions (server)"),
    ("steps", "Steps (server)"),
    ("mean_step_ms", "Mean step (ms, server)"),
    ("step_overhead_pct", "Step time outside forward (%, server)"),
]
RATES = [
    ("request_throughput", "Request throughput (req/s)"),
    ("request_goodput", "Request goodput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
]
LATENCIES = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E")]
HIGHER_IS_BETTER = {key for key, _ in RATES}
# Only client-side latencies compare: a mean step of different batch sizes does not.
LATENCY_KEYS = {key for key, _ in LATENCIES}


def rows(summary: dict) -> list[tuple[str, str, object]]:
    """(key, label, value) in table order; absent metrics are left out."""
    out = [(key, label, summary[key]) for key, label in COUNTS + RATES if key in summary]
    for key, name in LATENCIES:
        for stat, value in summary.get(key, {}).items():
            out.append((key, f"{name} {stat} (ms)", value))
    return out


def ratio(key: str, ours: object, theirs: object) -> float | None:
    """How many times better `ours` is than `theirs` on this metric, if that means anything."""
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return None
    if key in HIGHER_IS_BETTER:
        top, bottom = ours, theirs
    elif key in LATENCY_KEYS:
        top, bottom = theirs, ours
    else:
        return None
    if bottom <= 0 or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:g}"
    return str(value)


def markdown_table(
    columns: dict[str, dict], ratios: list[tuple[str, str, str]] | None = None
) -> str:
    """columns: label -> summary; ratios: (header, cbserve label, baseline label)."""
    ratios = [r for r in ratios or [] if r[1] in columns and r[2] in columns]
    labelled = {
        label: {row_label: (key, value) for key, row_label, value in rows(summary)}
        for label, summary in columns.items()
    }
    order = list(dict.fromkeys(row for cells in labelled.values() for row in cells))
    headers = [*columns, *(header for header, _, _ in ratios)]
    lines = [
        "| metric | " + " | ".join(headers) + " |",
        "| --- | " + " | ".join("---:" for _ in headers) + " |",
    ]
    for row in order:
        cells = [_cell(labelled[label].get(row, ("", ""))[1]) for label in columns]
        for _, ours, theirs in ratios:
            key, mine = labelled[ours].get(row, ("", None))
            _, base = labelled[theirs].get(row, ("", None))
            value = ratio(key, mine, base)
            cells.append("" if value is None else f"{value:.2f}x")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_summary(columns: dict[str, dict], ratios: list[tuple[str, str, str]]) -> dict:
    """The ratios again, for the JSON file: header -> metric label -> factor."""
    out: dict[str, dict[str, float]] = {}
    for header, ours, theirs in ratios:
        if ours not in columns or theirs not in columns:
            continue
        base = {label: value for _, label, value in rows(columns[theirs])}
        factors = {}
        for key, label, value in rows(columns[ours]):
            factor = ratio(key, value, base.get(label))
            if factor is not None:
                factors[label] = round(factor, 3)
        out[header] = factors
    return out


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # NaN is not JSON: an empty statistic is written as null.
    path.write_text(json.dumps(_no_nan(payload), indent=2) + "\n")


def _no_nan(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _no_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_no_nan(item) for item in value]
    return value
