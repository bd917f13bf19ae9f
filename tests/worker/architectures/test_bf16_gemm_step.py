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
from tests.worker.test_qblock_bf16_gemm import ICE_LAKE, ZEN4
from worker_svc.compute.qblock_linear import QBlockLinear, bf16_gemm_threshold
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
