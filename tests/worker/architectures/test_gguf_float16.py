"""GGUF files of 16-bit floats written by llama.cpp's own converter (`--outtype f16` and
`bf16`) from the random checkpoints, on the block path (`--dtype q4_1`): every
projection and the head on the file's own F16 / BF16 rows (none requantized), equal bit
for bit to gguf-py's dequantizer's values, the native step running every decode; its
logits against the float forward on the same file's dequantized weights. Gemma 3's BF16
file (every feature the step computes) in `make test`; Qwen3's F16 file (per-head norms)
and Llama 3's (its q/k rows permuted) in `make test-slow`, as test_gguf_files.py runs
Llama 3. The F16 rows' kernel and dequantizer are tested bit for bit in `make test`
(tests/worker/test_qblock_float16.py), Qwen3's f32 and q8_0 files in test_gguf_files.py."""

from __future__ import annotations

import gguf
import pytest
import torch

from tests.worker.architectures.test_block_path import native_and_python
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.architectures.test_gguf_files import logits
from worker_svc.compute.qblock import BF16, F16
from worker_svc.compute.qblock_linear import BF16_GEMM_ENV
from worker_svc.model_loader import load_model

pytestmark = [pytest.mark.model, pytest.mark.process]  # the converter is a subprocess

CASES = [
    pytest.param(("qwen3", "f16"), marks=pytest.mark.slow),
    ("gemma3", "bf16"),
    pytest.param(("llama3", "f16"), marks=pytest.mark.slow),
]
FORMAT = {"f16": F16, "bf16": BF16}


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def converted(request, checkpoints, tmp_path_factory):
    from bench.peers.converter import convert

    name, outtype = request.param
    out = tmp_path_factory.mktemp(f"gguf-{name}-{outtype}") / f"{outtype}.gguf"
    path = convert(checkpoints[name], out, outtype)
    with pytest.MonkeyPatch.context() as patch:  # the float kernels (as test_bfloat16_weights)
        patch.setenv(BF16_GEMM_ENV, "off")
        return path, FORMAT[outtype], load_model(path, "q4_1", CPU)


def test_every_projection_keeps_the_files_rows(converted):
    path, fmt, loaded = converted
    model = loaded.model
    assert "own blocks" in model.qblock_source
    assert loaded.model.native_decode_status == "native decode steps"
    for layer in model.layers:
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            assert getattr(layer, name).format is fmt, name
    assert model.lm_head.format is fmt
    # The file's down projection of layer 0, as gguf-py reads it (not permuted).
    tensors = gguf.GGUFReader(str(path)).tensors
    tensor = next(t for t in tensors if t.name == "blk.0.ffn_down.weight")
    want = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1, int(tensor.shape[0]))
    assert torch.equal(model.layers[0].down_proj.dequantized(), torch.from_numpy(want.copy()))


def test_the_block_path_computes_the_files_float_forward(converted):
    path, _, loaded = converted
    ids = prompt(13)
    dequantized = load_model(path, "float32", CPU)
    got, want = logits(loaded, ids), logits(dequantized, ids)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("variant", ["plain", "avx2", "avx512"])
def test_the_native_step_equals_the_python_forward(converted, variant):
    from worker_svc.compute.qblock import supported_variants

    if variant not in supported_variants():
        pytest.skip(f"this CPU does not run {variant}")
    got, want = native_and_python(converted[2], prompt(14, 16), variant)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
