"""Helpers for the native decode step's tests (test_native_decode.py over a float32 pool,
test_native_decode_kv16.py over a float16 one): a prefilled runner, one decode step by
the Python forward and by the native step from the same pool, and the arithmetic both
run on.

Why the two paths are compared on one named arithmetic (`on_path`), not only on the one
this CPU picks: the two paths differ only in the order the norms sum and in SiLU's
vectorised expf (llama_activation.c, -ffast-math); given the step's own norm and SiLU,
the Python forward's K/V and logits are bit-identical to the step's on every kernel
variant, VNNI included (measured on a Zen 4). Those last-bit differences then spread
through the layers by an amount that depends on the activations' path: with float
activations a flipped bit moves an output by about one unit in the last place; with the
VNNI kernel's 16-bit activation blocks it can move an activation to the neighbouring
level (2**-15 of its block's largest), and 30 layers later about 30% of the float16 K/V
differ in their last bit (70% identical at batch 16, against 90-95% on float
activations). Which path batch 16 takes is this CPU's measured threshold
(compute/measured.py: from 16 rows on Zen 4 and Emerald Rapids, from 256 on Ice Lake,
never without VNNI), so a bound measured on one class fails on another unless each
path is tested, with its own bound, on every CPU that runs it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
from dataclasses import dataclass

import pytest
import torch

import worker_svc.compute.qblock_linear as qblock_linear
from cbserve.worker.v1 import worker_pb2 as pb
from tests.worker.conftest import build_runner
from worker_svc.attention import BatchLayout, PagedAttentionContext
from worker_svc.compute.qblock import load_vnni_kernel, supported_variants
from worker_svc.compute.qblock_linear import VNNI_FROM_M, QBlockLinear
from worker_svc.models.qblock.native import NativeDecode

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
CONTEXTS = (70, 5, 37, *(12,) * 13)
BLOCK_SIZE = 16
# The native step sums the norms in another order than torch, and its SiLU rounds
# differently. With float activations (measured: 4e-7 of the largest logit, 6e-6
# absolute on K/V whose largest is about 20) that is all; with 16-bit activation blocks
# a last-bit difference in a norm's or SiLU's output can round an activation to its
# neighbouring level (measured: 9e-5 and 1.5e-3, the size of the VNNI path's own
# distance from float activations, 1.2e-4 and 2.4e-3).
TOLERANCES = {False: (1e-5, 1e-4), True: (5e-4, 1e-2)}  # by VNNI: logits rtol, KV atol


@dataclass(frozen=True)
class Path:
    """The arithmetic of both forwards: the float block kernel's variant and whether
    the projections take 16-bit activation blocks (the VNNI kernel) from VNNI_FROM_M rows."""

    variant: str = "auto"
    vnni: bool | None = None  # None: as this CPU's threshold says

    @property
    def name(self) -> str:
        return "vnni" if self.vnni else f"float-{self.variant}"


CPU_DEFAULT = Path()


def batch16_paths() -> list:
    """Every path this CPU runs: float activations on each kernel variant, and the VNNI
    kernel (once: it has no variants) where the CPU has AVX-512 VNNI."""
    paths = [Path(variant, vnni=False) for variant in supported_variants()]
    if load_vnni_kernel() is not None:
        paths.append(Path("auto", vnni=True))
    return [pytest.param(path, id=path.name) for path in paths]


@contextlib.contextmanager
def on_path(model, path: Path):
    """The native step for `path`, with the Python forward's projections put on the same
    arithmetic until the block exits."""
    projections = [m for m in model.modules() if isinstance(m, QBlockLinear)]
    saved = [(p.vnni, p.vnni_from_m) for p in projections]
    matmul = qblock_linear.qblock_matmul
    try:
        if path.vnni is not None:
            for projection in projections:
                projection.vnni, projection.vnni_from_m = path.vnni, VNNI_FROM_M
        qblock_linear.qblock_matmul = functools.partial(matmul, variant=path.variant)
        yield NativeDecode(model, variant=path.variant)
    finally:
        qblock_linear.qblock_matmul = matmul
        for projection, (vnni, threshold) in zip(projections, saved, strict=True):
            projection.vnni, projection.vnni_from_m = vnni, threshold


def prefill(loaded, contexts=CONTEXTS, seed=0, kv_dtype=None):
    """A runner whose sequences have computed their prompts and sampled one token each,
    over a pool of `kv_dtype` (default the model's: float32)."""
    runner = build_runner(loaded, num_blocks=64, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
    # The prompts by the Python forward, the state these tests' bounds were measured
    # from (a native prefill's state differs in last bits; test_native_prefill_rows.py).
    runner.prefill_rows = False
    rng = random.Random(seed)
    free = list(range(runner.pool.num_blocks))
    rng.shuffle(free)
    plan = pb.StepPlan()
    for seq_id, context in enumerate(contexts):
        tokens = [rng.randrange(100, 40000) for _ in range(context - 1)]
        blocks = [free.pop() for _ in range(-(-(context + 16) // BLOCK_SIZE))]
        new = pb.NewSequence(
            seq_id=seq_id,
            prompt_token_ids=tokens,
            num_scheduled_tokens=len(tokens),
            block_ids=blocks,
            sampling=GREEDY,
        )
        plan.new_sequences.append(new)
    runner.execute(plan)
    return runner


def prefilled(loaded, state):
    """A fresh runner in the prefilled state."""
    cache, sequences = state
    runner = build_runner(loaded, num_blocks=64, block_size=BLOCK_SIZE, kv_dtype=cache.dtype)
    runner.pool.cache.copy_(cache)
    runner.sequences = copy.deepcopy(sequences)
    return runner


def decode_step(runner, seq_ids):
    """The model's inputs for one decode of each sequence, as the runner builds them."""
    seqs = [runner.sequences[i] for i in seq_ids]
    layout = BatchLayout(
        query_lens=(1,) * len(seqs),
        context_lens=tuple(s.num_computed_tokens + 1 for s in seqs),
        block_tables=tuple(tuple(s.block_ids) for s in seqs),
        block_size=BLOCK_SIZE,
    )
    context = PagedAttentionContext(
        runner.backend, runner.pool, runner.backend.build_metadata(layout, torch.device("cpu"))
    )
    ids = torch.tensor([s.token_ids[s.num_computed_tokens] for s in seqs])
    positions = torch.tensor([s.num_computed_tokens for s in seqs])
    return ids, positions, context


_PYTHON_STEPS: dict = {}  # (seq_ids, rows, pool dtype, path) -> the Python forward's logits, pool


def python_and_native(loaded, state, native, seq_ids, sample_rows, path: Path = CPU_DEFAULT):
    """The pool before a step, then logits and the pool after it, by the Python forward
    (computed once per batch and path for the session; call inside `on_path(path)` for
    another path than the CPU's) and by `native`, each from that pool."""
    runner = prefilled(loaded, state)
    ids, positions, context = decode_step(runner, seq_ids)
    before = runner.pool.cache.clone()
    key = (tuple(seq_ids), tuple(sample_rows.tolist()), before.dtype, path)
    if key not in _PYTHON_STEPS:
        model = loaded.model
        saved, model.native_decode = model.native_decode, None
        try:
            with torch.inference_mode():
                logits = model(ids, positions, context, sample_rows)
        finally:
            model.native_decode = saved
        _PYTHON_STEPS[key] = logits, runner.pool.cache.clone()
        runner.pool.cache.copy_(before)
    with torch.inference_mode():
        native_logits = native(ids, positions, context, sample_rows)
    return before, _PYTHON_STEPS[key], (native_logits, runner.pool.cache)


def uses_vnni(native, rows):
    return native.vnni_from_m > 0 and rows >= native.vnni_from_m


def assert_close_logits(native, python, vnni=False, rtol=None):
    assert native.shape == python.shape
    error = (native - python).abs().max() / python.abs().max()
    assert error < (rtol or TOLERANCES[vnni][0]), f"relative error {error:.2e}"
    assert torch.equal(native.argmax(-1), python.argmax(-1))


@contextlib.contextmanager
def team_of(threads: int):
    """torch's (and so the native step's) thread count for a block: the attention split
    into parts depends on it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
