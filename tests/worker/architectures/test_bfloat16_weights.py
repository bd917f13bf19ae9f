"""`--dtype bfloat16-weights` on a bfloat16 checkpoint (what a Hugging Face directory
holds): every projection and the head kept as the checkpoint's own BF16 values (not
quantized to Q8_0), the Python block forward against the float32 forward of the same
checkpoint, and the native step against the Python forward on every kernel variant.
Qwen2 for its biases; Llama 3 for an untied head."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.worker.architectures.test_block_path import CLOSE, native_and_python
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.architectures.test_gguf_files import logits
from worker_svc.compute.qblock import BF16, supported_variants
from worker_svc.compute.qblock_linear import BF16_GEMM_ENV
from worker_svc.compute.weight_source import read_weight_source
from worker_svc.model_loader import load_model

pytestmark = pytest.mark.model

NAMES = ("qwen2", "llama3")


def bfloat16_copy(source, target):
    """The checkpoint with every tensor stored in bfloat16, as transformers saves one."""
    shutil.copytree(source, target)
    for file in target.glob("*.safetensors"):
        tensors = {name: t.to(torch.bfloat16) for name, t in load_file(file).items()}
        save_file(tensors, file, metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module", params=NAMES)
def bf16_dir(request, checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"bf16-{request.param}")
    return bfloat16_copy(checkpoints[request.param], root / request.param)


@pytest.fixture(scope="module")
def loaded(bf16_dir):
    # The float kernels at every M, compared with float32 below; BF16 rows on torch's
    # bf16 GEMM (activations in bfloat16): test_bf16_gemm_step.py.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BF16_GEMM_ENV, "off")
        return load_model(bf16_dir, "bfloat16-weights", CPU)


def test_the_projections_are_the_checkpoints_bf16_values(bf16_dir, loaded):
    model = loaded.model
    assert "kept as BF16" in model.qblock_source
    assert loaded.model.native_decode_status == "native decode steps"
    stored = load_file(next(bf16_dir.glob("*.safetensors")))
    layer = model.layers[0]
    assert layer.down_proj.format is BF16 and model.lm_head.format is BF16
    want = stored["model.layers.0.mlp.down_proj.weight"].float()
    assert torch.equal(layer.down_proj.dequantized(), want)
    q, k, v = (stored[f"model.layers.0.self_attn.{p}_proj.weight"].float() for p in "qkv")
    assert torch.equal(layer.qkv_proj.dequantized(), torch.cat([q, k, v]))


def test_the_block_path_computes_the_float32_forward_of_the_checkpoint(bf16_dir, loaded):
    ids = prompt(15)
    reference = load_model(bf16_dir, "float32", CPU)
    torch.testing.assert_close(logits(loaded, ids), logits(reference, ids), **CLOSE)


@pytest.mark.parametrize("variant", supported_variants())
def test_the_native_step_equals_the_python_forward(loaded, variant):
    got, want = native_and_python(loaded, prompt(16, 16), variant)
    torch.testing.assert_close(got, want, **CLOSE)


def test_auto_offers_it_for_this_checkpoint_only(bf16_dir, checkpoints, monkeypatch):
    monkeypatch.setenv("CBSERVE_QBLOCK_GGUF", "/nonexistent.gguf")
    bf16 = read_weight_source(bf16_dir)
    assert bf16.offers("bfloat16-weights") and not bf16.offers("q4_1")  # Q8_0 at load
    assert bf16.block_formats("bfloat16-weights") == ("BF16", "BF16")
    float32 = read_weight_source(checkpoints["qwen2"])
    assert float32.stored_dtype == "F32" and not float32.offers("bfloat16-weights")
