"""A GGUF mixing block formats per tensor, as a Q4_K_M file does, on the q4_1 path: made
here from the shipped model's weights (tests/worker/kquant_file.py; llama.cpp's
llama-quantize is not built in the test tiers), loaded on its own blocks (no
requantization, fused parts of different formats included), and run by the Python block
forward and the native decode step, each against the float forward of the very weights
the blocks dequantize to."""

from __future__ import annotations

import copy
import re

import gguf
import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker import native_step
from tests.worker.architectures.test_block_path import (
    dequantized_twin,
    native_and_python,
    run_prompt,
)
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.kquant_file import QTYPE, rewrite_gguf
from tests.worker.native_step import (
    TOLERANCES,
    Path,
    assert_close_logits,
    batch16_paths,
    on_path,
    prefill,
    python_and_native,
    uses_vnni,
)
from worker_svc.attention import CpuAttentionBackend
from worker_svc.compute.qblock import (
    Q4_K,
    Q5_0,
    Q6_K,
    Q8_0,
    dequantize,
    load_vnni_kernel,
    supported_variants,
)
from worker_svc.compute.qblock_stack import QBlockStack
from worker_svc.model_loader import load_model
from worker_svc.models.checkpoint.weights import undo_rope_permute

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

# Float32 sums in other orders through 30 layers, on logits of about +-20.
CLOSE = {"rtol": 1e-3, "atol": 2e-3}


def q4_k_m_like(name: str, k: int):
    """Q4_K / Q6_K where K is a multiple of 256 (SmolLM2's ffn_down), Q5_0 elsewhere,
    every third layer's attn_v in Q8_0 (its fused QKV mixes formats, as a Q4_K_M file's
    Q6_K v beside Q4_K q and k) and every fourth layer's ffn_up in Q8_0 (gate/up mixed)."""
    layer = re.match(r"blk\.(\d+)\.", name)
    if layer is None:
        return None  # the tied embedding / head stays Q8_0
    i = int(layer.group(1))
    if name.endswith("ffn_down.weight"):
        return QTYPE.Q6_K if i % 2 else QTYPE.Q4_K
    if name.endswith("attn_v.weight") and i % 3 == 0:
        return QTYPE.Q8_0
    if name.endswith("ffn_up.weight") and i % 4 == 1:
        return QTYPE.Q8_0
    return QTYPE.Q5_0


def file_weight(tensors: dict, name: str) -> torch.Tensor:
    """A tensor of the file as gguf-py's own dequantizer reads it, rows as the model has
    them (q and k un-permuted, as llama.cpp's converter permuted them)."""
    tensor = tensors[name]
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    weight = torch.from_numpy(values.reshape(-1, int(tensor.shape[0])).copy())
    role = name.split(".")[2]
    heads = {"attn_q": 9, "attn_k": 3}.get(role)  # SmolLM2-135M's heads and kv heads
    return undo_rope_permute(weight, heads) if heads else weight


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kquants") / "SmolLM2-135M-mixed.gguf"
    rewrite_gguf(packaged_gguf_path(), path, q4_k_m_like)
    return path


@pytest.fixture(scope="module")
def mixed(mixed_file):
    return load_model(mixed_file, "q4_1", CPU)


def test_every_tensor_keeps_the_files_blocks(mixed_file, mixed):
    model = mixed.model
    reader = gguf.GGUFReader(str(mixed_file))
    down = {t.name: t for t in reader.tensors if t.name.endswith("ffn_down.weight")}
    for i, layer in enumerate(model.layers):
        assert layer.down_proj.format is (Q6_K if i % 2 else Q4_K)
        tensor = down[f"blk.{i}.ffn_down.weight"]
        want = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert torch.equal(layer.down_proj.dequantized(), torch.from_numpy(want))
        assert layer.o_proj.format is Q5_0
        # Q5_0 q and k beside a Q8_0 v: two runs of rows, each in the file's format.
        assert formats_of(layer.qkv_proj) == ((Q5_0, Q8_0) if i % 3 == 0 else (Q5_0,))
        assert formats_of(layer.gate_up_proj) == ((Q5_0, Q8_0) if i % 4 == 1 else (Q5_0,))
    assert model.lm_head.format is Q8_0
    # Every block format is read by the VNNI kernel where the CPU has one.
    vnni_here = load_vnni_kernel() is not None
    assert all(layer.down_proj.vnni == vnni_here for layer in model.layers)


def formats_of(projection) -> tuple:
    return projection.formats if isinstance(projection, QBlockStack) else (projection.format,)


def test_fused_weights_of_mixed_formats_are_the_files_bit_for_bit(mixed_file, mixed):
    """Every fused projection, mixed or not, dequantizes to exactly what gguf-py reads
    from the file for its parts: no part was requantized."""
    tensors = {t.name: t for t in gguf.GGUFReader(str(mixed_file)).tensors}
    for i, layer in enumerate(mixed.model.layers):
        parts = {
            "qkv_proj": ("attn_q", "attn_k", "attn_v"),
            "gate_up_proj": ("ffn_gate", "ffn_up"),
            "o_proj": ("attn_output",),
        }
        for name, roles in parts.items():
            want = torch.cat([file_weight(tensors, f"blk.{i}.{role}.weight") for role in roles])
            assert torch.equal(getattr(layer, name).dequantized(), want), (i, name)


def test_python_forward_equals_the_float_forward_of_the_dequantized_weights(mixed):
    ids = prompt(11, 24)
    python = copy.copy(mixed.model)
    python.native_decode = None
    with torch.inference_mode():
        got = run_prompt(mixed, python, CpuAttentionBackend(), ids)
        want = run_prompt(mixed, dequantized_twin(mixed.model), CpuAttentionBackend(), ids)
    torch.testing.assert_close(got, want, **CLOSE)


@pytest.mark.parametrize("variant", supported_variants())
def test_native_step_runs_the_mixed_formats(mixed, variant):
    """One row a decode: on the AVX-512 variant of a VNNI CPU the step's Q5_0, Q4_K and
    Q6_K rows take 16-bit activation blocks (qblock_kquants_small_vnni.c) where the Python
    forward's float tiles take float32 ones: then the VNNI kernel's bound holds (measured
    on Zen 4 with Q5_0 alone: 1.0e-4 of the largest logit, 3e-5 in norm), elsewhere
    float32's."""
    assert mixed.model.native_decode_status == "native decode steps"
    got, want = native_and_python(mixed, prompt(12, 16), variant)
    if variant == "avx512" and load_vnni_kernel() is not None:
        assert_close_logits(got, want, vnni=True)
    else:
        torch.testing.assert_close(got, want, **CLOSE)


@pytest.fixture(scope="module")
def mixed_prefilled(mixed):
    """The mixed file's prefilled pool. native_step caches the Python forward's step by
    batch and path, not by model: emptied before and after, so that neither this
    module's nor test_native_decode.py's shipped model reads the other's logits."""
    native_step._PYTHON_STEPS.clear()
    runner = prefill(mixed)
    yield runner.pool.cache.clone(), runner.sequences
    native_step._PYTHON_STEPS.clear()


@pytest.mark.parametrize("path", batch16_paths())
def test_native_step_batch16_on_every_path(mixed, mixed_prefilled, path):
    """16 decodes at once: the K-quants and Q5_0 on the float kernel of every variant and,
    where the CPU has VNNI, on 16-bit activation blocks (qblock_kquants_vnni.c), beside
    the Python forward on the same arithmetic (tests/worker/native_step.py)."""
    with on_path(mixed.model, path) as native:
        assert uses_vnni(native, 16) == bool(path.vnni)
        before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
            mixed, mixed_prefilled, native, list(range(16)), torch.arange(16), path
        )
    assert_close_logits(nat_logits, py_logits, vnni=bool(path.vnni))
    assert torch.equal(nat_cache != before, py_cache != before)
    torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[bool(path.vnni)][1])


@pytest.mark.skipif(
    "avx512" not in supported_variants() or load_vnni_kernel() is None,
    reason="the small-M VNNI tiles run only in the AVX-512 variant on a VNNI CPU",
)
def test_one_row_keeps_float32_activations_where_the_vnni_kernel_is_off(mixed, mixed_prefilled):
    """The small-M tiles take 16-bit activations as the VNNI kernel does, so the switch
    that turns it off (CBSERVE_QBLOCK_VNNI=0: no projection reads VNNI) turns them off too:
    one row of the AVX-512 variant then stays within float32's bound of the Python
    forward (with the tiles: ~1e-4 of the largest logit, far past it)."""
    path = Path("avx512", vnni=False)
    with on_path(mixed.model, path) as native:
        assert native.vnni_from_m == 0
        _, (py_logits, _), (nat_logits, _) = python_and_native(
            mixed, mixed_prefilled, native, [0], torch.arange(1), path
        )
    assert_close_logits(nat_logits, py_logits, vnni=False)


def test_dequantize_reads_the_written_q4_k(mixed):
    blocks = mixed.model.layers[0].down_proj.blocks
    assert dequantize(blocks, Q4_K).abs().max() < 10  # finite, the scale of real weights
