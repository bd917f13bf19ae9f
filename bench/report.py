"""Latency and throughput statistics of one benchmark run, and how they are printed.

Definitions follow vLLM's serving benchmark:
- TTFT: from sending a request to receiving its first output token.
- TPOT: per request, (last token time - first token time) / (output tokens - 1);
  requests with one output token have none.
- ITL: the gaps between consecutive streamed messages that carry tokens, over all
  requests (one message per model step, so normally one token each).
Times are reported in milliseconds, rates per second of wall time.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path


@dataclass
class RequestTiming:
    """What one streamed request saw, in seconds on the client's monotonic clock."""

    prompt_tokens: int
    sent_at: float
    # (arrival time, number of tokens) per message that carried tokens.
    chunks: list[tuple[float, int]] = field(default_factory=list)
    finish_reason: str = ""

    @property
    def output_tokens(self) -> int:
        return sum(count for _, count in self.chunks)

    @property
    def ttft(self) -> float | None:
        return self.chunks[0][0] - self.sent_at if self.chunks else None

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.chunks[-1][0] - self.chunks[0][0]) / (self.output_tokens - 1)

    def itls(self) -> list[float]:
        return [later[0] - earlier[0] for earlier, later in pairwise(self.chunks)]


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default does."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ms(values: list[float], *stats: str) -> dict[str, float]:
    summary = {}
    for stat in stats:
        if stat == "mean":
            value = statistics.fmean(values) if values else float("nan")
        else:
            value = percentile(values, 50 if stat == "median" else float(stat[1:]))
        summary[stat] = round(value * 1000, 2)
    return summary


def summarize(timings: list[RequestTiming], wall_s: float) -> dict:
    output_tokens = sum(t.output_tokens for t in timings)
    prompt_tokens = sum(t.prompt_tokens for t in timings)
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    tpots = [t.tpot for t in timings if t.tpot is not None]
    itls = [gap for t in timings for gap in t.itls()]
    return {
        "wall_s": round(wall_s, 3),
        "requests": len(timings),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": round(len(timings) / wall_s, 3),
        "output_tokens_per_s": round(output_tokens / wall_s, 2),
        "total_tokens_per_s": round((prompt_tokens + output_tokens) / wall_s, 2),
        "ttft_ms": _ms(ttfts, "mean", "median", "p99"),
        "tpot_ms": _ms(tpots, "mean", "median", "p99"),
        "itl_ms": _ms(itls, "median", "p99"),
    }


def _flatten(summary: dict) -> dict[str, object]:
    flat = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            unit = key.rsplit("_", 1)[-1]
            name = key.rsplit("_", 1)[0].upper()
            for stat, number in value.items():
                flat[f"{name} {stat} ({unit})"] = number
        else:
            flat[key] = value
    return flat


def markdown_table(runs: dict[str, dict]) -> str:
    """One column per run (e.g. per dtype), one row per metric."""
    flat = {label: _flatten(summary) for label, summary in runs.items()}
    metrics = list(dict.fromkeys(key for run in flat.values() for key in run))
    lines = [
        "| metric | " + " | ".join(flat) + " |",
        "| --- | " + " | ".join("---:" for _ in flat) + " |",
    ]
    for metric in metrics:
        cells = [str(run.get(metric, "")) for run in flat.values()]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
