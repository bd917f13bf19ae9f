"""CPU seconds of processes, read from /proc, for the scheduler benchmark.

A process's user + system time (/proc/PID/stat fields 14 and 15, in clock ticks)
counts every thread it has, which is what a per-token CPU cost must include: grpc's
own threads, the worker's forward thread. A scheduler deployment may be several
processes (a core and API processes beside it), so a process is read together with
its descendants, each under its own name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    name: str
    cpu_s: float


def parse_stat(text: str, ticks_per_s: int = CLOCK_TICKS) -> ProcStat:
    """One /proc/PID/stat line. The name (field 2) is in parentheses and may itself hold
    spaces and parentheses, so the fields are counted from its last ')'."""
    open_at, close_at = text.index("("), text.rindex(")")
    pid = int(text[:open_at])
    name = text[open_at + 1 : close_at]
    # After the name: state(3) ppid(4) ... utime(14) stime(15).
    fields = text[close_at + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return ProcStat(pid=pid, ppid=int(fields[1]), name=name, cpu_s=(utime + stime) / ticks_per_s)


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """None once the process is gone."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def process_tree(root: int, proc: Path = PROC) -> list[ProcStat]:
    """root and every process below it, root first."""
    stats: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                stats[stat.pid] = stat
    if root not in stats:
        return []
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop(0)
        tree.append(stats[pid])
        pending.extend(sorted(children.get(pid, ())))
    return tree


def cpu_snapshot(roots: Mapping[str, int], proc: Path = PROC) -> dict[str, float]:
    """label -> CPU seconds so far, for each root and its descendants: a root's own
    time under its label, a descendant's under `label/pid`."""
    snapshot: dict[str, float] = {}
    for label, root in roots.items():
        for stat in process_tree(root, proc):
            key = label if stat.pid == root else f"{label}/{stat.pid}"
            snapshot[key] = stat.cpu_s
    return snapshot


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two snapshots; one that started in between
    counts from zero, and one that ended in between is left out (its time is lost)."""
    return {key: max(value - before.get(key, 0.0), 0.0) for key, value in after.items()}


def parse_machine_stat(text: str, ticks_per_s: int = CLOCK_TICKS) -> float:
    """Busy CPU seconds of the whole machine, all CPUs, from /proc/stat's `cpu` line:
    everything but idle and iowait (guest time is already inside user)."""
    line = next(line for line in text.splitlines() if line.startswith("cpu "))
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, line.split()[1:9])
    return (user + nice + system + irq + softirq + steal) / ticks_per_s


def machine_cpu_s(proc: Path = PROC) -> float:
    """What every process on the machine has used so far: the difference over a run,
    less what was measured, is the CPU that others took from it."""
    return parse_machine_stat((proc / "stat").read_text())


def own_cpu_s() -> float:
    """This process's user + system CPU seconds, all threads."""
    times = os.times()
    return times.user + times.system


def per_1k(cpu_s: float, count: int) -> float:
    """CPU seconds per 1,000 items (streamed tokens, messages); nan when none were."""
    return cpu_s * 1000 / count if count else float("nan")
