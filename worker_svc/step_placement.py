"""Where the Step stream runs a plan, and where its I/O goes around a step.

Which thread: a small plan runs on the event loop's own thread when no plan is before
it on the forward thread (runs_inline); bigger ones, and any plan behind one there, run
on the forward thread, so that stream reads and health checks are answered meanwhile.

Where the I/O goes (overlaps_step_io). Around a plan run on the loop, the stream writes
the result before it and reads the plan after it; each is a hand-off between grpc's own
threads and the loop, a few hundred microseconds of wall time apiece. Serial: the step
runs at once, and the write and the read happen between steps, while the step's threads
are idle. Overlapped: the stream first posts the next read and hands the last result to
grpc, then the step runs, and grpc's threads move both while the step holds the loop.
That pays only where grpc's threads find a core the step does not use: a core to spare
beside the step's threads, or a step on a GPU. Where the step's threads take every
core, grpc's threads take one of theirs mid-step and the others wait for it at the next
barrier. Measured on one stream of the Qwen3-MoE Q4_K_M file on 2 cores (Zen 4,
2026-11-29, alternated runs of a 512-token stream; bench/RESULTS.md): with 2 step
threads, overlapped 196 and 183 tok/s against serial 246 and 218; with 1 step thread,
overlapped 236.7, 229.2, 220.1, 222.3 against serial 214.5, 212.6, 203.2, 202.2.
"""

from __future__ import annotations

import os
from asyncio import Future
from collections.abc import Iterable

from cbserve.worker.v1 import worker_pb2

# Plans handed to a thread and not yet run: the one running and the next, sent meanwhile.
MAX_QUEUED_PLANS = 2

# A plan of at most this many rows (tokens, drafts included, times its steps) runs on the
# event loop's own thread when no plan is before it: a few decodes take milliseconds on
# a CPU, and the hop to the forward thread and back (two futures, a wake-up, and the GIL
# passed between threads twice) cost more than that step's Python: at one stream on 2
# cores, 8-16% more tokens a second (bench/RESULTS.md, issue 31's seventh pass). The
# loop then answers health checks after the step, a few milliseconds late; bigger plans,
# and a plan whose sampler may wait for deferred masks (which only the loop can read),
# keep the forward thread.
INLINE_PLAN_ROWS = 16


def runs_inline(plan: worker_pb2.StepPlan, queued: int) -> bool:
    """Whether a plan may run on the event loop's thread (see INLINE_PLAN_ROWS); queued:
    the plans before it that hold it back."""
    if queued or plan.deferred_mask_seq_ids:
        return False
    rows = len(plan.decode_seq_ids)
    rows += sum(new.num_scheduled_tokens for new in plan.new_sequences)
    rows += sum(c.num_scheduled_tokens + c.num_draft_tokens for c in plan.continuing_sequences)
    return rows * max(plan.num_steps, 1) <= INLINE_PLAN_ROWS


def plans_not_run(queued: Iterable[tuple[worker_pb2.StepPlan, Future]]) -> int:
    """Plans handed to a thread that have not finished; results waiting to be written
    do not count, so the next plan's read can be posted while they are written."""
    return sum(not future.done() for _, future in queued)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as taskset or a
    container's cpuset leaves it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


def overlaps_step_io(step_threads: int, device: str, cores: int | None = None) -> bool:
    """Overlap when the step leaves grpc a core: it runs on an accelerator, or its
    threads are fewer than the usable cores. A null worker ("none") computes nothing."""
    if not device.startswith("cpu"):
        return device != "none"
    return step_threads < (usable_cores() if cores is None else cores)
