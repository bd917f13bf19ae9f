"""A gpt-oss GGUF whose experts are MXFP4 blocks (GGUF type 39), as gpt-oss's released
files store them: llama.cpp's converter writes the random checkpoint as Q8_0, and its
`*_exps` tensors are rewritten to MXFP4 by gguf-py (tests/worker/kquant_file.py;
llama-quantize's MXFP4_MOE is not built in the test tiers). On the q4_1 path the experts
keep the file's 17-byte blocks (compute/kernels/qblock_mxfp4.c reads them), and the block
forward, the native decode step of every variant and 16 decodes at once on every path
(the VNNI panels included) compute what float32 computes on the same weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.worker import native_step
from tests.worker.architectures.test_block_path import native_and_python
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.architectures.test_gguf_files import logits
from tests.worker.kquant_file import QTYPE, rewrite_gguf
from tests.worker.native_step import (
    TOLERANCES,
    batch16_paths,
    on_path,
    prefill,
    python_and_native,
    uses_vnni,
)
from worker_svc.compute.qblock import MXFP4, supported_variants
from worker_svc.compute.qblock_stack import QBlockStack
from worker_svc.model_loader import load_model

pytestmark = [pytest.mark.model, pytest.mark.process]  # the converter is a subprocess

# Float32 sums in other orders (test_gguf_files.py's bound for a q8_0 file).
CLOSE = {"rtol": 1e-3, "atol": 1e-3}


@pytest.fixture(scope="module")
def mxfp4_file(checkpoints, tmp_path_factory):
    from bench.peers.converter import convert

    out = tmp_path_factory.mktemp("gguf-mxfp4")
    q8_0 = convert(checkpoints["gpt_oss"], out / "q8_0.gguf", "q8_0")
    path = out / "mxfp4.gguf"
    rewrite_gguf(q8_0, path, lambda name, k: QTYPE.MXFP4 if "_exps.weight" in name else None)
    return path


@pytest.fixture(scope="module")
def loaded(mxfp4_file):
    return load_model(mxfp4_file, "q4_1", CPU)


def test_the_experts_are_the_files_mxfp4_blocks(mxfp4_file, loaded):
    experts_in_file = {
        t.name: t for t in gguf.GGUFReader(str(mxfp4_file)).tensors if "_exps.weight" in t.name
    }
    assert {t.tensor_type for t in experts_in_file.values()} == {QTYPE.MXFP4}
    assert "own blocks" in loaded.model.qblock_source
    for i, layer in enumerate(loaded.model.layers):
        experts = layer.experts
        for projection in (*experts.gate_up_projs, *experts.down_projs):
            assert not isinstance(projection, QBlockStack) and projection.format is MXFP4
        stored = experts_in_file[f"blk.{i}.ffn_down_exps.weight"].data  # [experts, out, bytes]
        for e, down in enumerate(experts.down_projs):
            assert np.array_equal(down.blocks.numpy(), stored[e])  # as stored, no conversion


def test_the_block_path_computes_the_files_float32_weights(mxfp4_file, loaded):
    """Prefill on the Python block forward, decodes on the native step, against the
    float32 path on the same file (gguf-py's dequantizer)."""
    assert loaded.model.native_decode_status == "native decode steps"
    ids = prompt(12)
    dequantized = load_model(mxfp4_file, "float32", CPU)
    torch.testing.assert_close(logits(loaded, ids), logits(dequantized, ids), **CLOSE)


@pytest.mark.parametrize("variant", supported_variants())
def test_native_step_of_every_variant_equals_the_python_forward(loaded, variant):
    got, want = native_and_python(loaded, prompt(12, 16), variant)
    torch.testing.assert_close(got, want, **CLOSE)


@pytest.fixture(scope="module")
def prefilled(loaded):
    """As test_kquant_gguf.py's: native_step's cache of Python steps emptied around it."""
    native_step._PYTHON_STEPS.clear()
    runner = prefill(loaded)
    yield runner.pool.cache.clone(), runner.sequences
    native_step._PYTHON_STEPS.clear()


def assert_close_logits_off_ties(native, python, vnni: bool):
    """native_step's bound, the greedy tokens compared where the Python forward's top two
    logits differ (this random model has rows whose two best logits are equal: seen on
    the VNNI path, where either one is a right answer)."""
    error = ((native - python).norm() / python.norm()).item()
    assert error < TOLERANCES[vnni][0], f"relative error {error:.2e}"
    top = python.topk(2, dim=-1).values
    decided = top[:, 0] - top[:, 1] > 1e-3 * python.abs().max()
    assert decided.sum() >= len(decided) - 2
    assert torch.equal(native.argmax(-1)[decided], python.argmax(-1)[decided])


@pytest.mark.parametrize("path", batch16_paths())
def test_native_step_batch16_on_every_path(loaded, prefilled, path):
    """16 decodes at once: the experts' MXFP4 rows on the float kernel of every variant
    and, where the CPU has VNNI, packed into its panels, beside the Python forward."""
    with on_path(loaded.model, path) as native:
        assert uses_vnni(native, 16) == bool(path.vnni)
        before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
            loaded, prefilled, native, list(range(16)), torch.arange(16), path
        )
    assert_close_logits_off_ties(nat_logits, py_logits, vnni=bool(path.vnni))
    assert torch.equal(nat_cache != before, py_cache != before)
    torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[bool(path.vnni)][1])
