"""A bfloat16 checkpoint served as bfloat16-weights, where the CPU (its flags given
explicitly) has bf16 dot products: the native decode step runs every decode step, its
BF16 rows on the vdpbf16ps panels from BF16_PANEL_FROM_M rows (bfloat16 activations, as
the Python forward's torch bfloat16 GEMM takes them), with the Python forward's logits
and greedy tokens at 64 rows. Without the panels it leaves a step of bf16_gemm_from_m
rows or more to the Python forward; on a model whose projections are not all BF16, or on
a CPU without bf16 dot products, it runs every decode step on the float kernels."""

from __future__ import annotations

import pytest
import torch

from bench.micro.measure_dtype import make_runner
from bench.micro.step_profile import set_up, step_plan
from common.defaults import converted_model_dir
from tests.worker.architectures.checkpoints import write_checkpoint
from tests.worker.architectures.test_bfloat16_weights import bfloat16_copy
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.architectures.test_gguf_files import logits
from tests.worker.test_qblock_bf16_gemm import ICE_LAKE, ZEN4
from worker_svc.compute.qblock_bf16_panel import load_bf16_panel_kernel
from worker_svc.compute.qblock_linear import (
    BF16_GEMM_ENV,
    QBlockLinear,
    bf16_gemm_threshold,
)
from worker_svc.model_loader import load_model
from worker_svc.models.qblock.native import BF16_PANEL_FROM_M, NativeDecode

pytestmark = pytest.mark.model

SEQUENCES = 6
THRESHOLD = 4
needs_panels = pytest.mark.skipif(load_bf16_panel_kernel() is None, reason="no AVX-512 BF16")


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16-gemm-step")
    float32 = write_checkpoint("qwen3", root / "float32", converted_model_dir())
    return float32, bfloat16_copy(float32, root / "bfloat16")


def native_ran(
    path, dtype: str, flags: frozenset[str], batches, panels: bool | None = False
) -> list[bool]:
    """Whether the native step (with the bf16 panels or not; None: where the CPU has
    them) ran each decode step of `batches` rows, on a model whose BF16 projections take
    the GEMM from THRESHOLD rows on a CPU with `flags`."""
    runner = make_runner(dtype, SEQUENCES * 2 + 2, model=str(path))
    model = runner.loaded.model
    for module in model.modules():
        if isinstance(module, QBlockLinear):
            module.bf16_gemm_from_m = bf16_gemm_threshold(module.format, THRESHOLD, flags)
    step = NativeDecode(model, bf16_panels=panels)  # reads the thresholds just set
    if bf16_gemm_threshold(model.lm_head.format, THRESHOLD, flags) is None or panels is False:
        assert step.bf16_from_m == 0
    free = set_up(runner, [6] * SEQUENCES, seed=0, decode_room=len(batches) + 2)
    ran = []

    def counted(*args):
        logits = step(*args)
        ran.append(logits is not None)
        return logits

    model.native_decode = counted
    with torch.inference_mode():
        for batch in batches:
            result = runner.execute(step_plan(batch, [], free, runner.pool.block_size))
            assert len(result.token_ids) == batch  # one token a sequence, either way
    return ran


def test_without_the_panels_a_bf16_model_declines_from_the_threshold(qwen3_dirs):
    _, bfloat16 = qwen3_dirs
    ran = native_ran(bfloat16, "bfloat16-weights", ZEN4, [1, THRESHOLD - 1, THRESHOLD, 6])
    assert ran == [True, True, False, False]


@needs_panels
def test_with_the_panels_a_bf16_model_runs_every_step_natively(qwen3_dirs):
    _, bfloat16 = qwen3_dirs
    ran = native_ran(bfloat16, "bfloat16-weights", ZEN4, [1, THRESHOLD, 6], panels=None)
    assert ran == [True] * 3


@needs_panels
def test_64_rows_on_the_panels_give_the_torch_gemms_logits_and_tokens(qwen3_dirs):
    """Three decode steps of 64 rows from one prefilled state: the native step on the
    panels against the Python forward, both rounding the activations to bfloat16 at
    every BF16 projection (the served thresholds: 32 rows for the GEMM, Zen 4's)."""
    _, bfloat16 = qwen3_dirs
    native, native_tokens = decoded_64(bfloat16, native=True)
    python, python_tokens = decoded_64(bfloat16, native=False)
    assert native_tokens == python_tokens
    for got, want in zip(native, python, strict=True):
        error = (got - want).abs().max() / want.abs().max()
        assert error < 2e-2, f"relative error {error:.2e}"  # one bfloat16 output rounding


def decoded_64(path, native: bool, rows: int = 64, steps: int = 3):
    """The logits and tokens of `steps` decode steps of `rows` rows, by the native step
    on the panels or by the Python forward (torch's bfloat16 GEMM from 32 rows)."""
    runner = make_runner("bfloat16-weights", rows * 2 + 2, model=str(path))
    model = runner.loaded.model
    for module in model.modules():
        if isinstance(module, QBlockLinear):
            module.bf16_gemm_from_m = bf16_gemm_threshold(module.format, 32, ZEN4)
    step = NativeDecode(model) if native else None
    assert step is None or step.bf16_from_m == BF16_PANEL_FROM_M
    model.native_decode = step
    free = set_up(runner, [6] * rows, seed=1, decode_room=steps + 2)
    logits, tokens, forward = [], [], model.forward

    def recorded(*args, **kwargs):
        out = forward(*args, **kwargs)
        logits.append(out.clone())
        return out

    model.forward = recorded
    with torch.inference_mode():
        for _ in range(steps):
            result = runner.execute(step_plan(rows, [], free, runner.pool.block_size))
            tokens.append(list(result.token_ids))
    return logits, tokens


def test_a_cpu_without_bf16_dot_products_runs_every_step_natively(qwen3_dirs):
    _, bfloat16 = qwen3_dirs
    assert native_ran(bfloat16, "bfloat16-weights", ICE_LAKE, [THRESHOLD, 6]) == [True, True]


def test_a_model_of_other_blocks_runs_every_step_natively(qwen3_dirs):
    float32, _ = qwen3_dirs  # q4_1 quantizes it to Q8_0 at load
    assert native_ran(float32, "q4_1", ZEN4, [THRESHOLD, 6]) == [True, True]


def test_the_python_forward_on_the_gemm_stays_near_float32(qwen3_dirs, monkeypatch):
    """Every projection on the GEMM (activations rounded to bfloat16 at each one), the
    prompt's rows and each decode, against the float32 forward of the same weights: off
    by bfloat16 rounding, while the float kernels agree to 1e-3 (test_bfloat16_weights)."""
    _, bfloat16 = qwen3_dirs
    monkeypatch.setenv(BF16_GEMM_ENV, "off")  # the float kernels first
    loaded = load_model(bfloat16, "bfloat16-weights", CPU)
    loaded.model.native_decode = None
    projections = [m for m in loaded.model.modules() if isinstance(m, QBlockLinear)]
    ids = prompt(3)
    exact = [logits(loaded, ids)]
    for module in projections:
        module.bf16_gemm_from_m = bf16_gemm_threshold(module.format, 1, ZEN4)
    got, want = logits(loaded, ids), logits(load_model(bfloat16, "float32", CPU), ids)
    torch.testing.assert_close(exact[0], want, rtol=1e-3, atol=1e-3)
    assert not torch.equal(got, exact[0])  # the GEMM ran
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.1)  # measured: 0.024 at most
