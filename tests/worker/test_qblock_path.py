"""--dtype q4_1: the own forward on the GGUF's blocks, against the float32 reference.

The converted float32 model's weights are exactly the GGUF blocks' dequantized values,
so the path differs from float32 only in the order of its sums: greedy tokens equal,
perplexity within a hair. A float-only model gets Q8_0 blocks quantized at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.accuracy.eval import greedy_replies, perplexity
from common.defaults import default_model_path, packaged_gguf_path
from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer
from worker_svc.compute.qblock import Q4_1, Q8_0
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.model_loader import load_model
from worker_svc.models.architectures import load_architecture
from worker_svc.models.checkpoint.weights import load_state_dict
from worker_svc.models.qblock.build import find_blocks

LLAMA = load_architecture("llama")

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

QUESTIONS = ("What is the capital of France?", "Name three primary colors.")
TEXTS = (
    "The history of the river begins in the mountains, where snow melts each spring and "
    "feeds a hundred small streams. They join in the valley below, turning mills and "
    "watering orchards, until the water reaches the old stone bridge that the town built.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nprint([fibonacci(i) for i in range(10)])\n",
)


@pytest.fixture(scope="module")
def q4_1_model():
    return load_model(default_model_path(), "q4_1", torch.device("cpu"))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(default_model_path())


def test_runs_the_ggufs_own_blocks(q4_1_model):
    model = q4_1_model.model
    assert q4_1_model.compute_path == "q4_1" and q4_1_model.dtype == torch.float32
    assert "equal to the float32 weights" in model.qblock_source
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, QBlockLinear) and layer.qkv_proj.format is Q4_1
    assert isinstance(model.lm_head, QBlockLinear) and model.lm_head.format is Q8_0
    assert layer.qkv_proj.out_features == (9 + 2 * 3) * 64


def test_keeps_no_float32_projection_weight(q4_1_model):
    """The float32 tensors left are the embedding, the norms and the rotary tables: the
    projections and the head were never built in float32 (qblock.build._SkeletonState)."""
    model, shape = q4_1_model.model, q4_1_model.model.spec
    floats = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    assert not any(t.is_meta for t in floats)
    norms = (2 * shape.num_layers + 1) * shape.hidden_size
    rotary = 2 * shape.max_positions * shape.head_dim // 2
    assert sum(t.numel() for t in floats) == shape.vocab_size * shape.hidden_size + norms + rotary


def test_greedy_replies_equal_float32s(loaded_model, q4_1_model, tok):
    prompts = [tok.encode_chat([ChatTurn("user", q)]) for q in QUESTIONS]
    expected = greedy_replies(loaded_model, prompts, 16)
    assert greedy_replies(q4_1_model, prompts, 16) == expected
    assert "Paris" in tok.decode(expected[0])


def test_perplexity_within_a_tenth_of_a_percent(loaded_model, q4_1_model, tok):
    texts = [tok.encode(t, False) for t in TEXTS]
    reference = perplexity(loaded_model, texts)
    assert perplexity(q4_1_model, texts) == pytest.approx(reference, rel=1e-3)


def test_a_gguf_that_is_not_the_source_is_refused():
    """A float model whose weights differ from the GGUF's in one value gets Q8_0."""
    state = load_state_dict(Path(default_model_path()), LLAMA, 9, 3)
    state["model.layers.3.mlp.up_proj.weight"][0, 0] += 1e-3
    blocks, why = find_blocks(Path(default_model_path()), LLAMA, state)
    assert blocks is None
    assert "model.layers.3.mlp.up_proj.weight differs" in why


def test_a_float_only_model_is_quantized_to_q8_0(monkeypatch, loaded_model, tok):
    monkeypatch.setenv("CBSERVE_QBLOCK_GGUF", "/nonexistent.gguf")
    loaded = load_model(default_model_path(), "q4_1", torch.device("cpu"))
    assert loaded.model.qblock_source.startswith("Q8_0 quantized at load")
    assert loaded.model.layers[0].down_proj.format is Q8_0
    texts = [tok.encode(t, False) for t in TEXTS]
    assert perplexity(loaded, texts) == pytest.approx(perplexity(loaded_model, texts), rel=0.01)
