"""`--dtype auto` on a CPU: the fastest of the paths that may run here, measured here.

The candidates are the paths that pass the accuracy gate (auto_eligible) and run on
this CPU, in the order the measured table gives (compute/measured.py via
selection.path_order; the generic order for a CPU the table does not know). At a
CPU's first start with a model's shapes they are timed on those shapes
(compute/path_timing.py, a few seconds) and the choice is cached on disk
(compute/choice_cache.py); later starts read it back.

The table only seeds: it breaks near-ties. A path is taken over one ranked before it
only when it measured more than TIE_MARGIN faster, because a few percent is within
the noise of a busy machine, and the table's order holds what a short timing cannot
see (q4_1's native decode step, the accuracy of its exact weights). A CPU absent
from the table still gets the fastest path, by measurement.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import structlog
import torch

from worker_svc.compute.choice_cache import ChoiceKey, read_choice, write_choice
from worker_svc.compute.model_shapes import ProjectionShapes
from worker_svc.compute.path_timing import StepTime, TimingPlan, time_paths
from worker_svc.compute.paths import PATHS
from worker_svc.compute.weight_source import WeightSource

log = structlog.get_logger("worker_svc.compute")

TIE_MARGIN = 0.05
DEFAULT_PLAN = TimingPlan()


@dataclass(frozen=True)
class MeasuredChoice:
    path: str
    figures: dict[str, StepTime]
    batch_m: int
    # Where the figures come from: "measured in 2.4 s" or "cached <file>, measured <when>".
    source: str

    def describe(self) -> str:
        """The ready log's compute_path_choice: the choice and the figures that decided it."""
        if not self.figures:
            return f"auto ({self.path}: {self.source})"
        ranked = sorted(self.figures.items(), key=lambda item: item[1].score)
        figures = ", ".join(f"{name} {t.m1_ms:.1f} / {t.batch_ms:.1f}" for name, t in ranked)
        return (
            f"auto (measured: {self.path}; projections per decode step, ms at "
            f"M=1 / M={self.batch_m}: {figures}; {self.source})"
        )


def decide(figures: dict[str, StepTime], seed_order: list[str]) -> str:
    """The first path in `seed_order` whose score is within TIE_MARGIN of the best."""
    best = min(t.score for t in figures.values())
    for name in seed_order:
        if name in figures and figures[name].score <= best * (1 + TIE_MARGIN):
            return name
    raise ValueError(f"no path of {seed_order} was timed")


def measured_choice(
    candidates: list[str],
    shapes: ProjectionShapes,
    flags: frozenset[str],
    cpu: str,
    plan: TimingPlan = DEFAULT_PLAN,
    weights: WeightSource | None = None,
) -> MeasuredChoice:
    """`candidates` in the table's order; the chosen one, from the cache or timed now.
    The block paths are timed on the formats `weights` says they would run (the
    shipped GGUF's where unknown)."""
    candidates = _buildable(candidates)
    formats = {
        name: weights.block_formats(name) if weights is not None else ("Q4_1", "Q8_0")
        for name in candidates
        if PATHS[name].blocks
    }
    if len(candidates) == 1:
        return MeasuredChoice(candidates[0], {}, plan.batch_m, "the only candidate here")
    key = ChoiceKey(
        cpu=cpu,
        flags=tuple(sorted(flags)),
        shapes=shapes,
        candidates=tuple(sorted(candidates)),
        threads=torch.get_num_threads(),
        batch_m=plan.batch_m,
        block_formats=tuple(sorted((name, *pair) for name, pair in formats.items())),
    )
    cached, why_not = read_choice(key)
    if cached is not None:
        source = f"cached in {cached.file}, measured {cached.measured_at}"
        return MeasuredChoice(cached.path, cached.figures, plan.batch_m, source)
    started = time.perf_counter()
    figures = time_paths(candidates, shapes, plan, formats)
    seconds = time.perf_counter() - started
    path = decide(figures, candidates)
    # Figures timed while other processes held the cores can rank the paths wrongly
    # (seen: q4_1 10x its idle time, bfloat16 chosen): such a choice serves this start
    # only, and the next start on a quieter machine measures again.
    busy = machine_busy()
    file = None if busy else write_choice(key, path, figures)
    log.info(
        "compute_path_measured",
        choice=path,
        cache=why_not,
        seconds=round(seconds, 2),
        threads=key.threads,
        # A busy machine skews the figures (other processes take the cores mid-kernel):
        # the load says how far to trust them. Delete the cache file to measure again.
        load_average=round(os.getloadavg()[0], 2),
        shapes=shapes.describe(),
        figures_ms={n: [round(t.m1_ms, 2), round(t.batch_ms, 2)] for n, t in figures.items()},
        cache_file=str(file)
        if file
        else ("not kept: the machine was busy" if busy else "not writable"),
    )
    source = f"measured now in {seconds:.1f} s on {torch.get_num_threads()} threads"
    if busy:
        source += ", on a busy machine: not cached"
    return MeasuredChoice(path, figures, plan.batch_m, source)


def machine_busy() -> bool:
    """More runnable work over the last minute than the machine has cores."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def _buildable(candidates: list[str]) -> list[str]:
    """Drops the block paths where their kernel cannot be built (a compiler that fails,
    not a missing one: selection refuses that before), so that the others are still
    timed."""
    blocks = [name for name in candidates if PATHS[name].blocks]
    if not blocks:
        return candidates
    from worker_svc.compute.qblock import load_qblock_kernel
    from worker_svc.native_build import KernelUnavailableError

    try:
        load_qblock_kernel()
    except KernelUnavailableError as exc:
        for name in blocks:
            log.warning("compute_path_unavailable", path=name, reason=str(exc))
        return [name for name in candidates if name not in blocks]
    return candidates
