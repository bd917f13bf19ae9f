"""Times the compute paths' projections on one model's shapes, with random weights.

What is timed is a decode step's projection cost: per layer the fused QKV, the output,
the fused gate/up and the down projection, times the layer count, plus the LM head,
at M = 1 (one stream) and at a batch M, through the kernels each path really runs:
torch's matmul in that dtype for float32 / bfloat16 / float16, and QBlockLinear for the
block paths (q4_1, bfloat16-weights), in the formats the model's files give them
(compute/weight_source.py: the shipped GGUF's Q4_1 projections and Q8_0 head, Q8_0
made at load, or BF16 rows), with the thresholds it takes on this CPU.

Why the projections alone are a fair measure: they are what the paths do differently
(the weights' bytes, which bound a step at M = 1, and the GEMM at a batch). The rest of
a step (norms, rotary, attention, sampling) costs each path about the same, except
that q4_1 runs a whole decode step as one native call where the float paths pay
Python and a few hundred small operators; leaving that out can only favour the float
paths, so a q4_1 that wins here wins by more in the worker.

Why several copies of a layer: a layer of SmolLM2 is 14 MB of float32, smaller than
the last-level cache, so timing one layer over and over would read it from cache and
hide the very bytes that make float32 slow at M = 1. Each path gets as many random
copies as fill twice the last-level cache (never more than the model's layers), and
a round walks through all of them, as a step walks through its layers. The paths'
rounds are interleaved (A B C A B C ...) so that a machine whose speed drifts (other
processes) slows all of them alike, and the median of the rounds is kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from worker_svc.compute.model_shapes import ProjectionShapes

FALLBACK_CACHE_BYTES = 32 << 20


@dataclass(frozen=True)
class TimingPlan:
    batch_m: int = 32
    # Rounds per path and M: at least min_rounds, then more while under budget_s
    # (all paths together), never more than max_rounds.
    min_rounds: int = 3
    max_rounds: int = 9
    budget_s: float = 2.0
    cache_bytes: int | None = None  # None: read the last-level cache size of this CPU

    def __post_init__(self):
        if self.batch_m < 2 or self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(f"bad timing plan {self}")


@dataclass(frozen=True)
class StepTime:
    """Milliseconds of one decode step's projections, at M = 1 and at the batch M."""

    m1_ms: float
    batch_ms: float

    @property
    def score(self) -> float:
        # The geometric mean: neither one stream nor a full batch is given up for the other.
        return (self.m1_ms * self.batch_ms) ** 0.5


# One layer's projections (weights as the path keeps them) and its head, called on x.
_Linear = Callable[[torch.Tensor], torch.Tensor]


def last_level_cache_bytes() -> int:
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        scale = units.get(size[-1:], 1)
        digits = size[:-1] if size[-1:] in units else size
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or FALLBACK_CACHE_BYTES


def _float_linear(out_in: tuple[int, int], dtype: torch.dtype) -> _Linear:
    weight = torch.empty(out_in, dtype=dtype).uniform_(-0.05, 0.05)
    return lambda x: F.linear(x, weight)


def _random_blocks(out_in: tuple[int, int], fmt) -> torch.Tensor:
    """Random quants with valid float16 scales (and Q4_1 minima) in every block; F16 and
    BF16: weights of a trained model's scale (no subnormals, which some CPUs slow on)."""
    from worker_svc.compute.qblock import BF16, F16, Q4_1, QK, quantize

    rows, k = out_in
    if fmt in (F16, BF16):
        return quantize(torch.empty(out_in).uniform_(-0.05, 0.05), fmt)
    blocks = torch.randint(0, 256, (rows, k // QK, fmt.block_bytes), dtype=torch.uint8)
    header = 4 if fmt is Q4_1 else 2
    scales = torch.empty((rows, k // QK, header // 2), dtype=torch.float16).uniform_(0.001, 0.01)
    blocks[..., :header] = scales.view(torch.uint8).reshape(rows, k // QK, header)
    return blocks.reshape(rows, -1)


def _block_linear(out_in: tuple[int, int], fmt_name: str, head: bool) -> _Linear:
    from worker_svc.compute.qblock import FORMATS
    from worker_svc.compute.qblock_linear import QBlockLinear

    fmt = FORMATS[fmt_name]
    # The model's head never takes the dense chunks (qblock_linear.py says why).
    extra = {"dense_from_m": None} if head else {}
    return QBlockLinear(_random_blocks(out_in, fmt), fmt, out_in[1], **extra)


# The block paths' formats where the caller names none: the shipped GGUF's.
SHIPPED_FORMATS = ("Q4_1", "Q8_0")


def _bytes_per_weight(path: str, block_format: str | None) -> float:
    if block_format is not None:
        from worker_svc.compute.qblock import FORMATS

        fmt = FORMATS[block_format]
        return fmt.block_bytes / fmt.block_weights
    return {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}[path]


class _PathUnderTest:
    """One path's random layers and head, and the inputs it is called on."""

    def __init__(
        self,
        path: str,
        shapes: ProjectionShapes,
        cache: int,
        block_formats: tuple[str, str] | None = None,
    ):
        self.path = path
        self.shapes = shapes
        layer_weights = sum(o * i for o, i in shapes.layer_projections())
        layer_bytes = layer_weights * _bytes_per_weight(path, block_formats and block_formats[0])
        copies = max(1, min(shapes.layers, -(-2 * cache // int(layer_bytes))))
        if block_formats is not None:
            projection, head = block_formats
            self.layers = [
                [_block_linear(p, projection, head=False) for p in shapes.layer_projections()]
                for _ in range(copies)
            ]
            self.head = _block_linear(shapes.head(), head, head=True)
            self.dtype = torch.float32
        else:
            self.dtype = getattr(torch, path)
            self.layers = [
                [_float_linear(p, self.dtype) for p in shapes.layer_projections()]
                for _ in range(copies)
            ]
            self.head = _float_linear(shapes.head(), self.dtype)
        self.rounds: dict[int, tuple[list[float], list[float]]] = {}

    def _inputs(self, m: int) -> list[torch.Tensor]:
        return [torch.randn(m, i).to(self.dtype) for _, i in self.shapes.layer_projections()]

    def run_round(self, m: int) -> None:
        """One pass over every layer copy, then the head; records per-layer and head time."""
        inputs = self._inputs(m)
        head_input = inputs[0]
        started = time.perf_counter()
        for layer in self.layers:
            for linear, x in zip(layer, inputs, strict=True):
                linear(x)
        layers_done = time.perf_counter()
        self.head(head_input)
        head_done = time.perf_counter()
        per_layer, head = self.rounds.setdefault(m, ([], []))
        per_layer.append((layers_done - started) / len(self.layers))
        head.append(head_done - layers_done)

    def step_ms(self, m: int) -> float:
        per_layer, head = self.rounds[m]
        step = self.shapes.layers * statistics.median(per_layer) + statistics.median(head)
        return step * 1e3


def time_paths(
    paths: list[str],
    shapes: ProjectionShapes,
    plan: TimingPlan | None = None,
    block_formats: dict[str, tuple[str, str]] | None = None,
) -> dict[str, StepTime]:
    """Each path's projection time per decode step on `shapes`, measured here, on the
    calling thread's torch thread count. `block_formats`: the (projections, head) formats
    of each block path (default SHIPPED_FORMATS). Raises what building a path's kernel
    raises."""
    from worker_svc.compute.paths import PATHS

    plan = plan or TimingPlan()
    cache = plan.cache_bytes or last_level_cache_bytes()
    formats = {
        path: (block_formats or {}).get(path, SHIPPED_FORMATS)
        for path in paths
        if PATHS[path].blocks
    }
    under_test = [_PathUnderTest(path, shapes, cache, formats.get(path)) for path in paths]
    started = time.perf_counter()
    ms = (1, plan.batch_m)
    with torch.inference_mode():
        for candidate in under_test:  # warm-up: kernels built, pages touched, caches warm
            for m in ms:
                candidate.run_round(m)
            candidate.rounds.clear()
        for round_index in range(plan.max_rounds):
            if round_index >= plan.min_rounds and time.perf_counter() - started > plan.budget_s:
                break
            for candidate in under_test:
                for m in ms:
                    candidate.run_round(m)
    return {c.path: StepTime(c.step_ms(1), c.step_ms(plan.batch_m)) for c in under_test}
