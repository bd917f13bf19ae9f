"""Qwen2-MoE's shared expert and its window rule beyond the architectures table
(test_float_forward.py and test_block_path.py run its checkpoint there): the config read
without transformers as transformers reads it where the file lists no layer types, the
declaration's checks, and a GGUF written by llama.cpp's own converter from a checkpoint
shaped as the released ones (every layer sparse, top-k weights not renormalized, no
window): its f32 file computes what the original computes, and its q8_0 file runs on its
own blocks (the shared expert's `ffn_*_shexp` tensors included) with decode steps on
the Python forward, the native step naming the feature it lacks."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.worker.architectures.checkpoints import COMMON
from tests.worker.architectures.test_config_reading import assert_same_as_transformers, written
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.architectures.test_gguf_files import logits
from worker_svc.model_loader import load_model
from worker_svc.models.mixture import MoeSpec

QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 96,
}


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"decoder_sparse_step": 2, "mlp_only_layers": [5]},
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 5},
    ],
)
def test_the_config_reads_as_transformers_reads_it(tmp_path, settings):
    """No `layer_types` in the file (as in the released configs): the sparse layers and
    the windows follow Qwen2-MoE's own rules, which transformers' config applies."""
    spec = assert_same_as_transformers(written(tmp_path, {**QWEN2_MOE, **settings}))
    assert spec.qkv_bias and spec.moe.shared_intermediate_size == 96
    assert spec.moe.shared_expert_gated and not spec.moe.normalize_topk
    if "mlp_only_layers" in settings:
        assert spec.moe.sparse_layers == {1, 3, 7}
    if "use_sliding_window" in settings:
        assert spec.windows == (8, None, 8, None, 8, None, None, None)


def test_a_gated_shared_expert_needs_its_width():
    with pytest.raises(ValueError, match="shared_intermediate_size"):
        MoeSpec(4, 2, 32, frozenset({0}), shared_expert_gated=True)
    with pytest.raises(ValueError, match="positive"):
        MoeSpec(4, 2, 32, frozenset({0}), shared_intermediate_size=0)
    assert MoeSpec(4, 2, 32, frozenset({0}), shared_intermediate_size=8).features()[
        "a shared expert"
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import transformers as hf

    from bench.peers.converter import convert
    from bench.peers.random_weights import randomize
    from common.defaults import converted_model_dir

    root = tmp_path_factory.mktemp("qwen2-moe-gguf")
    config = hf.Qwen2MoeConfig(
        **COMMON,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=96,
    )
    model = hf.AutoModelForCausalLM.from_config(config)
    randomize(model, seed=42)
    source = root / "source"
    model.save_pretrained(source)
    for file in converted_model_dir().iterdir():  # the converter reads the tokenizer
        if file.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(file, source / file.name)
    return (
        source,
        convert(source, root / "f32.gguf", "f32"),
        convert(source, root / "q8.gguf", "q8_0"),
    )


@pytest.mark.model
@pytest.mark.process  # the converter is a subprocess
@pytest.mark.slow
def test_a_gguf_computes_what_its_original_computes(files):
    source, f32, q8_0 = files
    original = load_model(source, "float32", CPU)
    from_file = load_model(f32, "float32", CPU)
    assert from_file.architecture.name == "qwen2_moe"
    assert from_file.model.spec.moe == original.model.spec.moe
    ids = prompt(13)
    torch.testing.assert_close(logits(from_file, ids), logits(original, ids), rtol=1e-5, atol=1e-5)
    blocks = load_model(q8_0, "q4_1", CPU)
    assert "own blocks" in blocks.model.qblock_source
    # The native step runs the shared expert and its gate (decode_shared_expert.h, 7b648dd).
    status = blocks.model.native_decode_status
    assert status == "native decode steps", status
    dequantized = load_model(q8_0, "float32", CPU)
    torch.testing.assert_close(logits(blocks, ids), logits(dequantized, ids), rtol=1e-3, atol=1e-3)
