"""Which compute path a worker runs: `--dtype auto` takes the fastest this CPU has.

"Fastest" is measured on this CPU, on the model's projection shapes, at the first
start and then cached (compute/auto_choice.py), when the caller passes the shapes
(the worker does). The measurements kept in the repo (compute.measured, printed by
`python -m bench.micro.kernels`), matched to this CPU by its flags, give the order the
candidates are tried in and break near-ties; without shapes they alone decide. A CPU
unlike any measured one gets the generic order below as its seed. Flags alone would
mislead: on a Zen 3, float32 beats emulated bfloat16 by 6-25x, and torch's
weight-only int8/int4 kernels ran at 2-5 GFLOP/s on a Zen 5.

A path named explicitly is taken or refused, never swapped: forcing one the CPU
lacks fails at start with one line naming the missing feature.
"""

from __future__ import annotations

from worker_svc.compute.measured import closest_measured
from worker_svc.compute.model_shapes import ProjectionShapes
from worker_svc.compute.paths import PATHS, ComputePath
from worker_svc.compute.weight_source import WeightSource

# For CPUs like no measured one, and after a measured CPU's own ranking for the paths
# it did not measure. q4_1 first wherever its kernels build: it computes with the
# GGUF's weights exactly (the float32 model's, where converted from that GGUF) and
# passes the accuracy gate, reading a sixth of float32's bytes; at one stream, where
# a step is bound by memory, it measured 2-3x float32 on every CPU tried. Then native
# 16-bit, then float32. int8 last: it fails the gate (paths.py) and is never auto.
# bfloat16-weights is offered for a bfloat16 checkpoint only (weight_source.py, where
# q4_1's Q8_0 made at load is not: it failed the gate), and ranked just before q4_1 in
# every order, so that it leads wherever the table ranks q4_1 first.
GENERIC_ORDER = ("bfloat16-weights", "q4_1", "bfloat16", "float16", "float32", "int8")
EXACT_BEFORE = {"bfloat16-weights": "q4_1"}


class ComputePathUnavailableError(RuntimeError):
    """The requested path cannot run here; the message names what is missing."""


def path_order(flags: frozenset[str]) -> tuple[list[str], str]:
    """Path names, fastest first, and where the order comes from."""
    measured = closest_measured(flags)
    if measured is None:
        return list(GENERIC_ORDER), "generic order (no measured CPU matches these flags)"
    ranked = sorted(measured.gflops, key=measured.score, reverse=True)
    rest = [name for name in GENERIC_ORDER if name not in ranked]
    return _exact_first(ranked + rest), f"measured on {measured.name}"


def _exact_first(order: list[str]) -> list[str]:
    """`order` with each EXACT_BEFORE path moved just before the path it ties with."""
    for path, before in EXACT_BEFORE.items():
        if path in order and before in order:
            order.remove(path)
            order.insert(order.index(before), path)
    return order


def select_path(
    requested: str,
    device_type: str,
    flags: frozenset[str],
    own_forward: bool = True,
    shapes: ProjectionShapes | None = None,
    cpu: str | None = None,
    weights: WeightSource | None = None,
) -> tuple[ComputePath, str]:
    """The path to run and why (for the ready log). Raises ComputePathUnavailableError.

    `shapes`: the model's projections; with them, `auto` on a CPU times its candidates
    (or reads the cached choice). `cpu`: the CPU's model name for the cache key
    (default: this machine's; tests pass a made-up one with made-up flags). `weights`:
    what the model's files store; `auto` offers bfloat16-weights only where they say
    it is exact, and times the block paths on the formats they would run."""
    if requested != "auto":
        if requested not in PATHS:
            raise ValueError(f"unknown dtype {requested!r}; choose from {sorted(PATHS)}")
        path = PATHS[requested]
        problem = _problem(path, device_type, flags, own_forward)
        if problem:
            raise ComputePathUnavailableError(problem)
        return path, "requested"
    if device_type == "cuda":
        return PATHS["bfloat16"], "auto (CUDA: bfloat16)"
    order, source = path_order(flags)
    candidates = [
        name
        for name in order
        if PATHS[name].auto_eligible
        and _problem(PATHS[name], device_type, flags, own_forward) is None
        and (weights.offers(name) if weights is not None else name != "bfloat16-weights")
    ]
    if not candidates:
        return PATHS["float32"], "auto (fallback)"
    if shapes is None:
        return PATHS[candidates[0]], f"auto ({source})"
    from worker_svc.compute.auto_choice import measured_choice
    from worker_svc.compute.cpu_features import cpu_name

    choice = measured_choice(candidates, shapes, flags, cpu or cpu_name(), weights=weights)
    return PATHS[choice.path], choice.describe()


def _problem(path: ComputePath, device_type: str, flags: frozenset[str], own: bool) -> str | None:
    if device_type == "cuda":
        return None if path.runs_on_cuda else f"--dtype {path.name} runs on CPUs only"
    if path.needs_own_forward and not own:
        return f"--dtype {path.name} needs the own forward (--model-impl auto or cbserve)"
    if path.blocks:
        from worker_svc.native_build import compiler

        if compiler() is None:
            return f"--dtype {path.name} needs a C compiler (gcc, cc or $CC) to build its kernels"
    return path.missing_on_cpu(flags)
