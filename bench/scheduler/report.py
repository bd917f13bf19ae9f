"""What the scheduler benchmark measured, and its tables: pure, no processes.

A load is N null workers with a simulated step time and a number of client streams,
a share of which may ask for JSON-schema structured outputs (the null workers then
sample within the scheduler's allowed-token masks, so the scheduler's CPU includes
computing and sending those masks).
What the workers could make at that load: every stream decodes one token per step of
its worker, the streams split evenly, a step taking step_ms + us_per_token x its
tokens. The share is what the clients got of that; the workers' busy fraction is their
own account (the time inside their runner, cbserve_worker_forward_seconds), and what
is left of the wall time, per step, is the time a worker spent waiting for the
scheduler between steps.

`python -m bench.scheduler.report out/bench-scheduler/results.json` prints a run's
tables again (with this version's columns).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field

from bench.scheduler.cpu_accounting import per_1k

_LOAD = re.compile(
    r"^\s*(\d+)x(\d+(?:\.\d+)?)(?:\+(\d+(?:\.\d+)?))?:(\d+)(?:/(json|regex)(\d+))?\s*$"
)
CONSTRAINTS = ("json", "regex")
# The scheduler deployment's processes carry this label (and label/PID for children).
SCHEDULER = "scheduler"
BARE = "bare"


@dataclass(frozen=True)
class Load:
    """`WORKERSxSTEP_MS[+US_PER_TOKEN]:STREAMS[/jsonPERCENT|/regexPERCENT]`, e.g.
    `2x10:64`, `1x0:512`, `2x5+20:64`, `1x0:64/json50` (half the streams constrained by
    a JSON schema: the scheduler then computes an allowed-token mask per constrained
    row and step), `1x10:48/regex50` (half by a regex)."""

    workers: int
    step_ms: float
    streams: int
    us_per_token: float = 0.0
    # Percent of the streams whose requests carry a structured output (the name is
    # older than regex loads: results.json files keep it).
    json_pct: int = 0
    # What constrains them: "json" (load.py's JSON_SCHEMA) or "regex" (its REGEX).
    constraint: str = "json"

    def __post_init__(self) -> None:
        if self.workers < 1 or self.streams < 1:
            raise ValueError(f"a load needs >= 1 worker and >= 1 stream, got {self}")
        if not (0 <= self.step_ms < math.inf and 0 <= self.us_per_token < math.inf):
            raise ValueError(f"step times must be finite and >= 0, got {self}")
        if not 0 <= self.json_pct <= 100 or self.constraint not in CONSTRAINTS:
            raise ValueError(f"the constrained share is 0 to 100 percent, got {self}")

    @classmethod
    def parse(cls, text: str) -> Load:
        match = _LOAD.match(text)
        if not match:
            raise ValueError(
                f"a load is WORKERSxSTEP_MS[+US_PER_TOKEN]:STREAMS[/jsonPERCENT], got {text!r}"
            )
        workers, step_ms, per_token, streams, constraint, pct = match.groups()
        return cls(
            int(workers),
            float(step_ms),
            int(streams),
            float(per_token or 0),
            int(pct or 0),
            constraint or "json",
        )

    @property
    def constrained_streams(self) -> int:
        return round(self.streams * self.json_pct / 100)

    @property
    def spec(self) -> str:
        extra = f"+{self.us_per_token:g}" if self.us_per_token else ""
        constrained = f"/{self.constraint}{self.json_pct}" if self.json_pct else ""
        return f"{self.workers}x{self.step_ms:g}{extra}:{self.streams}{constrained}"

    @property
    def label(self) -> str:
        workers = f"{self.workers} worker{'s' if self.workers > 1 else ''}"
        step = f"{self.step_ms:g} ms steps" if self.step_ms else "no step time"
        if self.us_per_token:
            step += f" + {self.us_per_token:g} us/token"
        kind = "JSON" if self.constraint == "json" else "regex"
        constrained = f" ({self.constrained_streams} {kind}-constrained)" if self.json_pct else ""
        return f"{workers}, {step}, {self.streams} streams{constrained}"

    @property
    def capacity_tok_s(self) -> float:
        """Decode tokens a second the workers could make; inf with no step time."""
        total = 0.0
        for index in range(self.workers):
            n = self.streams // self.workers + (index < self.streams % self.workers)
            step_s = self.step_ms / 1e3 + self.us_per_token / 1e6 * n
            if n and step_s == 0:
                return math.inf
            total += n / step_s if n else 0.0
        return total


@dataclass(frozen=True)
class Measurement:
    """One load through one front ("grpc", "http", or "bare": the floor server)."""

    load: Load
    front: str
    wall_s: float
    requests: int
    completed: int
    tokens: int
    messages: int
    client_cpu_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    # Summed over the workers: seconds inside their runner, and steps they ran.
    worker_busy_s: float = 0.0
    worker_steps: int = 0
    # The whole machine's busy CPU over the run: what is not ours was someone else's.
    machine_cpu_s: float = 0.0
    errors: tuple[str, ...] = ()
    # Of the tokens, those of the constrained streams; the seconds each kind of stream
    # took, summed over its streams (from its first request to its last answer).
    constrained_tokens: int = 0
    constrained_stream_s: float = 0.0
    free_stream_s: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def share(self) -> float:
        capacity = self.load.capacity_tok_s
        return self.tok_s / capacity if math.isfinite(capacity) else math.nan

    @property
    def busy(self) -> float:
        return self.worker_busy_s / (self.wall_s * self.load.workers) if self.wall_s else math.nan

    @property
    def outside_ms_per_step(self) -> float:
        """Mean time a worker waited between two steps (wall time it was not busy)."""
        if not self.worker_steps:
            return math.nan
        idle_s = self.wall_s * self.load.workers - self.worker_busy_s
        return max(idle_s, 0.0) / self.worker_steps * 1e3

    def server_cpu_s(self, label: str) -> float:
        """CPU of the process `label` and its descendants."""
        return sum(v for k, v in self.cpu_s.items() if k == label or k.startswith(label + "/"))

    @property
    def server_cpu_per_1k(self) -> float:
        """CPU seconds per 1k streamed tokens (the floor server: per 1k messages)."""
        label = BARE if self.front == BARE else SCHEDULER
        count = self.messages if self.front == BARE else self.tokens
        return per_1k(self.server_cpu_s(label), count)

    @property
    def scheduler_cpu_ms_per_step(self) -> float:
        """The scheduler's CPU per worker step: unlike the wall times, a machine that
        others share does not inflate it."""
        if not self.worker_steps:
            return math.nan
        return self.server_cpu_s(SCHEDULER) / self.worker_steps * 1e3

    @property
    def client_cpu_per_1k(self) -> float:
        return per_1k(self.client_cpu_s, self.tokens)

    @property
    def other_cores(self) -> float:
        """CPUs' worth that other processes used during the run (0 on a quiet machine)."""
        if not (self.wall_s and self.machine_cpu_s):
            return math.nan
        ours = sum(self.cpu_s.values()) + self.client_cpu_s
        return max(self.machine_cpu_s - ours, 0.0) / self.wall_s

    @property
    def failed(self) -> int:
        return self.requests - self.completed

    def tok_s_a_stream(self, constrained: bool) -> float:
        """Output tokens a second a constrained (or a free) stream got over its own time:
        every stream asks for as many tokens, so over the whole run's they would tie."""
        tokens = self.constrained_tokens if constrained else self.tokens - self.constrained_tokens
        seconds = self.constrained_stream_s if constrained else self.free_stream_s
        return tokens / seconds if seconds else math.nan


def measurement_from_json(data: dict) -> Measurement:
    """A Measurement back from results.json (asdict, plus derived values ignored), so that
    a run's tables can be made again, or two runs compared."""
    fields = {k: v for k, v in data.items() if k != "derived"}
    fields["load"] = Load(**fields["load"])
    fields["errors"] = tuple(fields.get("errors", ()))
    return Measurement(**fields)


def _num(value: float, digits: int = 0) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "(unbounded)"
    return f"{value:,.{digits}f}"


def floor_for(rows: list[Measurement], streams: int) -> Measurement | None:
    return next((r for r in rows if r.front == BARE and r.load.streams == streams), None)


def capacity_table(rows: list[Measurement]) -> str:
    """One line per load and front; x floor is the scheduler's CPU per token over the
    bare server's CPU per message at the same number of streams."""
    lines = [
        "| load | front | output tok/s | workers could make | share | workers busy "
        "| outside the workers, ms/step | scheduler CPU ms/step | scheduler CPU s/1k tok "
        "| x floor "
        "| load generator CPU s/1k tok | other processes, CPUs | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.front == BARE:
            continue
        floor = floor_for(rows, row.load.streams)
        floor_cpu = floor.server_cpu_per_1k if floor else math.nan
        # A very short floor run can read 0 s: CPU time comes in clock ticks (10 ms).
        ratio = row.server_cpu_per_1k / floor_cpu if floor_cpu > 0 else math.nan
        lines.append(
            f"| {row.load.label} | {row.front} | {_num(row.tok_s)} "
            f"| {_num(row.load.capacity_tok_s)} | {_num(row.share, 2)} | {_num(row.busy, 2)} "
            f"| {_num(row.outside_ms_per_step, 2)} | {_num(row.scheduler_cpu_ms_per_step, 2)} "
            f"| {_num(row.server_cpu_per_1k, 3)} "
            f"| {_num(ratio, 2)} | {_num(row.client_cpu_per_1k, 3)} "
            f"| {_num(row.other_cores, 2)} | {row.failed} |"
        )
    return "\n".join(lines)


def structured_table(rows: list[Measurement]) -> str:
    """Loads with constrained streams: what one constrained and one free stream got (a
    constrained row planned every step gets about what a free one gets)."""
    lines = [
        "| load | front | constrained tok/s a stream | free tok/s a stream | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        if row.front == BARE or not row.load.constrained_streams:
            continue
        constrained, free = row.tok_s_a_stream(True), row.tok_s_a_stream(False)
        lines.append(
            f"| {row.load.label} | {row.front} | {_num(constrained, 1)} | {_num(free, 1)} "
            f"| {_num(constrained / free if free else math.nan, 2)} |"
        )
    return "\n".join(lines)


def floor_table(rows: list[Measurement]) -> str:
    lines = [
        "| streams | bare server messages/s | bare server CPU s/1k messages "
        "| load generator CPU s/1k messages | other processes, CPUs | failed |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.front == BARE:
            lines.append(
                f"| {row.load.streams} | {_num(row.messages / row.wall_s if row.wall_s else 0)} "
                f"| {_num(row.server_cpu_per_1k, 3)} "
                f"| {_num(per_1k(row.client_cpu_s, row.messages), 3)} "
                f"| {_num(row.other_cores, 2)} | {row.failed} |"
            )
    return "\n".join(lines)


def process_table(rows: list[Measurement]) -> str:
    """Each measured process's CPU per 1k streamed tokens (messages for the floor): a
    scheduler deployment of several processes shows each of them here."""
    lines = ["| load | front | CPU s/1k tokens by process |", "|---|---|---|"]
    for row in rows:
        count = row.messages if row.front == BARE else row.tokens
        cells = [f"{label} {per_1k(cpu, count):.3f}" for label, cpu in sorted(row.cpu_s.items())]
        cells.append(f"load generator {per_1k(row.client_cpu_s, count):.3f}")
        # The floor server has no workers: its rows are named by their streams only.
        label = f"{row.load.streams} streams" if row.front == BARE else row.load.label
        lines.append(f"| {label} | {row.front} | {', '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    (path,) = sys.argv[1:] if argv is None else argv
    with open(path) as results:
        rows = [measurement_from_json(data) for data in json.load(results)]
    tables = [capacity_table(rows), floor_table(rows), process_table(rows)]
    if any(row.load.constrained_streams for row in rows):
        tables.insert(1, structured_table(rows))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
