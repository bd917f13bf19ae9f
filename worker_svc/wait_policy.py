"""The worker's OpenMP wait policy: how long an idle thread spins before it sleeps.

libgomp's default spins about 300,000 times (a few hundred microseconds) at every
barrier and at the end of every parallel region, which assumes the cores belong to
the process. A worker rarely has its cores to itself (a second worker, the
scheduler, a benchmark client, a build on the same machine), and a thread that spins
through its time slice while its partner waits for a core makes the whole step wait:
measured by `python -m bench.micro.wait_policy` (README, "OpenMP wait policy"), a bounded
spin keeps a decode step near its idle time beside a busy process, where the
default made it several times slower, and costs little when the machine is idle.

libgomp reads these variables once, when it is loaded (with torch), so they are set
at the worker process's start, before anything imports torch; a value the user set
(either variable) is left alone, as is a process that already loaded torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field

POLICY_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


@dataclass(frozen=True)
class WaitPolicy:
    # Tens of microseconds of spinning: enough to catch the next operator's region on
    # an idle machine, short enough not to burn a competitor's time slice.
    environment: dict[str, str] = field(default_factory=lambda: {"GOMP_SPINCOUNT": "10000"})


DEFAULT_POLICY = WaitPolicy()


def apply_wait_policy(
    environ: MutableMapping[str, str] = os.environ, policy: WaitPolicy = DEFAULT_POLICY
) -> tuple[dict[str, str], str]:
    """Sets the policy's variables where the user set none of them; returns what is in
    effect and where it comes from (for the start log)."""
    global _applied
    chosen = {name: environ[name] for name in POLICY_VARIABLES if name in environ}
    if chosen:
        _applied = chosen, "set by the user"
    elif "torch" in sys.modules:
        _applied = {}, "libgomp already loaded: its defaults"
    else:
        environ.update(policy.environment)
        _applied = dict(policy.environment), "the worker's default (bench/micro/wait_policy.py)"
    return _applied


_applied: tuple[dict[str, str], str] | None = None


def applied_policy() -> dict[str, object] | None:
    """What apply_wait_policy set at this process's start, for the worker's start log
    (logged there, not at once: a worker that cannot start says so in one line)."""
    return None if _applied is None else {"policy": _applied[0], "source": _applied[1]}
