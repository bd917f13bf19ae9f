"""Projections made of runs of rows in different block formats (compute/qblock_stack.py,
what a Q4_K_M file's fused QKV is), cut where the native step's panels of 32 rows do
not end, so that one panel spans two formats: the Python forward against the float
forward on the dequantized weights, and the native step against the Python forward on
every kernel variant this CPU runs. Qwen2: its q/k/v biases are added after the runs."""

from __future__ import annotations

import copy
from itertools import pairwise

import pytest
import torch

from tests.worker.architectures.test_block_path import (
    CLOSE,
    dequantized_twin,
    native_and_python,
    run_prompt,
)
from tests.worker.architectures.test_float_forward import CPU, prompt
from worker_svc.attention import CpuAttentionBackend
from worker_svc.compute.qblock import Q4_1, Q8_0, quantize, supported_variants
from worker_svc.compute.qblock_stack import QBlockStack, qblock_projection
from worker_svc.model_loader import load_model

pytestmark = pytest.mark.model

# projection -> (rows where a run ends, the runs' formats); none a multiple of 32.
CUTS = {
    "qkv_proj": ((40, 75), (Q8_0, Q4_1, Q8_0)),
    "o_proj": ((7,), (Q4_1, Q8_0)),
    "gate_up_proj": ((100,), (Q4_1, Q8_0)),  # gate's 128 rows end inside the second run
    "down_proj": ((33,), (Q8_0, Q4_1)),
}


def cut_into_runs(projection, cuts, formats):
    weight = projection.dequantized()
    edges = [0, *cuts, weight.shape[0]]
    runs = [
        (quantize(weight[start:end], fmt), fmt, weight.shape[1])
        for (start, end), fmt in zip(pairwise(edges), formats, strict=True)
    ]
    return qblock_projection(runs, projection.bias)


@pytest.fixture(scope="module")
def runs_model(checkpoints):
    loaded = load_model(checkpoints["qwen2"], "q4_1", CPU)
    model = loaded.model
    model.native_decode = None  # its addresses are the replaced projections'
    for layer in model.layers:
        for name, (cuts, formats) in CUTS.items():
            setattr(layer, name, cut_into_runs(getattr(layer, name), cuts, formats))
    model.lm_head = cut_into_runs(model.lm_head, (1000,), (Q8_0, Q4_1))
    return loaded


def test_the_projections_are_runs_with_the_bias_kept(runs_model):
    layer = runs_model.model.layers[0]
    assert isinstance(layer.qkv_proj, QBlockStack)
    assert layer.qkv_proj.formats == (Q8_0, Q4_1, Q8_0)
    assert layer.qkv_proj.bias is not None  # Qwen2's, added once after the runs


def test_the_python_forward_computes_the_runs_dequantized_weights(runs_model):
    ids = prompt(5, 12)
    python = copy.copy(runs_model.model)
    with torch.inference_mode():
        got = run_prompt(runs_model, python, CpuAttentionBackend(), ids)
        want = run_prompt(
            runs_model, dequantized_twin(runs_model.model), CpuAttentionBackend(), ids
        )
    torch.testing.assert_close(got, want, **CLOSE)


@pytest.mark.parametrize("variant", supported_variants())
def test_the_native_step_reads_panels_across_runs(runs_model, variant):
    got, want = native_and_python(runs_model, prompt(6, 12), variant)
    torch.testing.assert_close(got, want, **CLOSE)
