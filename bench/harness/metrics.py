"""What one request saw, and the statistics of a run, defined as vLLM's serving benchmark does.

- TTFT: from sending a request to receiving its first output token.
- E2E latency: from sending a request to receiving its last output token.
- TPOT: per request, (E2E - TTFT) / (output tokens - 1); none for a 1-token output.
- ITL: the gaps between consecutive streamed messages that carry tokens, pooled over
  all requests (one message per model step, so normally one token each).
- Goodput: completed requests per second that met every given SLO (`ttft:MS`,
  `tpot:MS`, `e2el:MS`); a 1-token output counts as TPOT 0 there, as in vLLM.
- Throughputs divide by the run's wall time, from the first send to the last reply.
Failed requests count only as `failed`. Times are reported in milliseconds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from itertools import pairwise

import numpy

SLO_METRICS = ("ttft", "tpot", "e2el")
STATS = ("mean", "median", "p99")


@dataclass
class RequestTiming:
    """One request, in seconds on the client's monotonic clock."""

    prompt_tokens: int
    sent_at: float
    # (arrival time, number of tokens) per message that carried tokens.
    chunks: list[tuple[float, int]] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.chunks)

    @property
    def output_tokens(self) -> int:
        return sum(count for _, count in self.chunks)

    @property
    def ttft(self) -> float | None:
        return self.chunks[0][0] - self.sent_at if self.chunks else None

    @property
    def e2el(self) -> float | None:
        return self.chunks[-1][0] - self.sent_at if self.chunks else None

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    def itls(self) -> list[float]:
        return [later[0] - earlier[0] for earlier, later in pairwise(self.chunks)]


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile, linear interpolation between closest ranks (as vLLM's
    benchmark reports them); nan where numpy would raise on an empty list."""
    if not values:
        return math.nan
    return float(numpy.percentile(values, q, method="linear"))


def stats_ms(values: list[float]) -> dict[str, float]:
    """mean, median, p99 of seconds, in milliseconds (nan when there is nothing)."""
    mean = statistics.fmean(values) if values else math.nan
    return {
        "mean": round(mean * 1000, 2),
        "median": round(percentile(values, 50) * 1000, 2),
        "p99": round(percentile(values, 99) * 1000, 2),
    }


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        if name not in SLO_METRICS or not value:
            raise ValueError(f"goodput wants NAME:MS with NAME in {SLO_METRICS}, got {pair!r}")
        number = float(value)
        if number < 0:
            raise ValueError(f"goodput SLO must be >= 0 ms, got {pair!r}")
        slos[name] = number
    return slos


def meets_slos(timing: RequestTiming, slos: dict[str, float]) -> bool:
    measured = {"ttft": timing.ttft, "tpot": timing.tpot or 0.0, "e2el": timing.e2el}
    return all(measured[name] * 1000 <= limit for name, limit in slos.items())


def summarize(
    timings: list[RequestTiming], wall_s: float, slos: dict[str, float] | None = None
) -> dict:
    done = [t for t in timings if t.ok]
    output_tokens = sum(t.output_tokens for t in done)
    prompt_tokens = sum(t.prompt_tokens for t in done)
    summary = {
        "completed": len(done),
        "failed": len(timings) - len(done),
        "duration_s": round(wall_s, 3),
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": round(len(done) / wall_s, 3),
        "output_throughput": round(output_tokens / wall_s, 2),
        "total_token_throughput": round((prompt_tokens + output_tokens) / wall_s, 2),
    }
    if slos:
        good = sum(meets_slos(t, slos) for t in done)
        summary["request_goodput"] = round(good / wall_s, 3)
    summary["ttft_ms"] = stats_ms([t.ttft for t in done])
    summary["tpot_ms"] = stats_ms([t.tpot for t in done if t.tpot is not None])
    summary["itl_ms"] = stats_ms([gap for t in done for gap in t.itls()])
    summary["e2el_ms"] = stats_ms([t.e2el for t in done])
    return summary


def per_request(timings: list[RequestTiming]) -> list[dict]:
    """Small per-request records for the JSON file (not every ITL: those are large)."""
    return [
        {
            "prompt_tokens": t.prompt_tokens,
            "output_tokens": t.output_tokens,
            "ttft_ms": None if t.ttft is None else round(t.ttft * 1000, 2),
            "e2el_ms": None if t.e2el is None else round(t.e2el * 1000, 2),
            "finish_reason": t.finish_reason,
            "error": t.error,
        }
        for t in timings
    ]
