"""The native decode step leaves a step of bf16_gemm_from_m rows or more to the Python
forward (whose BF16 projections then take torch's bfloat16 GEMM), on a bfloat16
checkpoint served as bfloat16-weights, where the CPU (its flags given explicitly) has
bf16 dot products; below the threshold, on a model whose projections are not all BF16,
or on a CPU without them, it runs every decode step itself."""

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
from worker_svc.compute.qblock_linear import (
    BF16_GEMM_ENV,
    QBlockLinear,
    bf16_gemm_threshold,
)
from worker_svc.model_loader import load_model
from worker_svc.models.qblock.build import attach_native_decode

pytestmark = pytest.mark.model

SEQUENCES = 6
THRESHOLD = 4


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16-gemm-step")
    float32 = write_checkpoint("qwen3", root / "float32", converted_model_dir())
    return float32, bfloat16_copy(float32, root / "bfloat16")


def native_ran(path, dtype: str, flags: frozenset[str], batches) -> list[bool]:
    """Whether the native step ran each decode step of `batches` rows, on a model whose
    BF16 projections take the GEMM from THRESHOLD rows on a CPU with `flags`."""
    runner = make_runner(dtype, SEQUENCES * 2 + 2, model=str(path))
    model = runner.loaded.model
    for module in model.modules():
        if isinstance(module, QBlockLinear):
            module.bf16_gemm_from_m = bf16_gemm_threshold(module.format, THRESHOLD, flags)
    attach_native_decode(model)  # reads the thresholds just set
    step = model.native_decode
    assert step is not None, model.native_decode_status
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


def test_a_bf16_model_declines_from_the_threshold(qwen3_dirs):
    _, bfloat16 = qwen3_dirs
    ran = native_ran(bfloat16, "bfloat16-weights", ZEN4, [1, THRESHOLD - 1, THRESHOLD, 6])
    assert ran == [True, True, False, False]


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
