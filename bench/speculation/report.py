"""The speculation benchmark's table: tok/s with speculation off and on, their ratio and
the acceptance, one row per workload, number of streams and server.

Figures are recorded per run (one server start each), off and on alternated; a row's
tok/s is the mean over its repeats, and the ratio is the ratio of those means. The
acceptance is summed over the `on` runs before dividing, so that a run with many
drafts weighs as much as its drafts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from bench.speculation.acceptance import Acceptance

OFF, ON = "off", "on"


@dataclass(frozen=True)
class Run:
    """One server, one workload at one concurrency, speculation off or on."""

    workload: str
    concurrency: int
    system: str  # "cbserve" or "llama.cpp"
    speculation: str  # OFF or ON
    output_tokens: int
    wall_s: float
    failed: int = 0
    acceptance: Acceptance = field(default_factory=Acceptance)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.nan


@dataclass(frozen=True)
class Row:
    workload: str
    concurrency: int
    system: str
    off: tuple[Run, ...]
    on: tuple[Run, ...]

    @property
    def tok_s_off(self) -> float:
        return _mean([run.tokens_per_s for run in self.off])

    @property
    def tok_s_on(self) -> float:
        return _mean([run.tokens_per_s for run in self.on])

    @property
    def ratio(self) -> float:
        off = self.tok_s_off
        return self.tok_s_on / off if off and not math.isnan(off) else math.nan

    @property
    def acceptance(self) -> Acceptance:
        runs = [run.acceptance for run in self.on]
        return Acceptance(
            drafts=sum(a.drafts for a in runs),
            draft_tokens=sum(a.draft_tokens for a in runs),
            accepted_tokens=sum(a.accepted_tokens for a in runs),
        )

    @property
    def same_tokens(self) -> bool:
        """Whether every run produced as many tokens: greedy replies with speculation on
        and off should be the same ones, so a difference is worth a look."""
        return len({run.output_tokens for run in self.off + self.on}) <= 1


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def rows(runs: list[Run]) -> list[Row]:
    """Runs grouped into rows, in the order their first run was measured."""
    keys = list(dict.fromkeys((r.workload, r.concurrency, r.system) for r in runs))
    grouped = []
    for workload, concurrency, system in keys:
        mine = [
            r
            for r in runs
            if (r.workload, r.concurrency, r.system) == (workload, concurrency, system)
        ]
        grouped.append(
            Row(
                workload,
                concurrency,
                system,
                tuple(r for r in mine if r.speculation == OFF),
                tuple(r for r in mine if r.speculation == ON),
            )
        )
    return grouped


def _figure(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


HEADER = (
    "| workload | streams | server | tok/s off | tok/s on | on/off | mean acceptance length "
    "| acceptance rate | output tokens off / on |"
)


def table(grouped: list[Row]) -> str:
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for row in grouped:
        acceptance = row.acceptance
        tokens = "/".join(str(r.output_tokens) for r in row.off) + " / "
        tokens += "/".join(str(r.output_tokens) for r in row.on)
        lines.append(
            f"| {row.workload} | {row.concurrency} | {row.system} "
            f"| {_figure(row.tok_s_off, 1)} | {_figure(row.tok_s_on, 1)} "
            f"| {_figure(row.ratio, 2)}x | {_figure(acceptance.mean_acceptance_length, 2)} "
            f"| {_figure(acceptance.acceptance_rate, 3)} | {tokens} |"
        )
    return "\n".join(lines)


def markdown(grouped: list[Row], heading: list[str], notes: list[str]) -> str:
    """The table with what it was measured on above it and its notes below."""
    parts = ["\n".join(heading), table(grouped)]
    if notes:
        parts.append("\n".join(f"- {note}" for note in notes))
    return "\n\n".join(parts) + "\n"
