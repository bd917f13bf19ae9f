"""The own Llama forward (worker_svc/models/forward/decoder.py) against transformers' modules, in
float32, layer by layer: the embedding, every decoder layer's output, and the logits,
for a fresh prefill and for a decode that continues it from the paged KV cache."""

from __future__ import annotations

import pytest
import torch

from worker_svc.attention import BatchLayout, PagedAttentionContext, TorchAttentionBackend
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.models.forward.decoder import DecoderForCausalLM

# float32 over 30 layers of fused vs separate matmuls: the same sums in another order.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def own(loaded_model):
    if loaded_model.dtype != torch.float32:
        pytest.fail("the layer-by-layer comparison is for the float32 reference path")
    assert isinstance(loaded_model.model, DecoderForCausalLM), loaded_model.model_impl
    return loaded_model


def capture_layer_outputs(layers) -> tuple[list[torch.Tensor], list]:
    outputs: list[torch.Tensor] = []

    def hook(module, args, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    return outputs, [layer.register_forward_hook(hook) for layer in layers]


@pytest.fixture
def pool(own) -> KVPool:
    """Eight blocks of 16: one sequence of up to 128 tokens, in blocks 0..7."""
    spec = KVPoolSpec(own.num_layers, own.num_kv_heads, own.head_dim, 16, torch.float32)
    return KVPool(spec, 8)


def paged_context(loaded, pool, query_len: int, context_len: int) -> PagedAttentionContext:
    backend = TorchAttentionBackend()
    layout = BatchLayout((query_len,), (context_len,), (tuple(range(8)),), 16)
    return PagedAttentionContext(backend, pool, backend.build_metadata(layout, loaded.device))


def test_layers_and_logits_match_transformers(own, pool, reference_model, tokenizer):
    ids = tokenizer("The quick brown fox jumps over the lazy dog, and then", return_tensors="pt")
    input_ids = ids.input_ids[0]
    t = len(input_ids)
    ref_outputs, ref_hooks = capture_layer_outputs(reference_model.model.layers)
    own_outputs, own_hooks = capture_layer_outputs(own.model.layers)
    try:
        with torch.inference_mode():
            ref = reference_model(input_ids=input_ids[None]).logits[0]
            logits = own.model(
                input_ids, torch.arange(t), paged_context(own, pool, t, t), torch.arange(t)
            )
    finally:
        for handle in ref_hooks + own_hooks:
            handle.remove()
    assert len(own_outputs) == len(ref_outputs) == own.num_layers
    embedded = reference_model.model.embed_tokens(input_ids)
    torch.testing.assert_close(own.model.embed_tokens[input_ids], embedded)
    for index, (mine, theirs) in enumerate(zip(own_outputs, ref_outputs, strict=True)):
        torch.testing.assert_close(mine, theirs[0], **TOLERANCE, msg=f"layer {index}")
    torch.testing.assert_close(logits, ref, **TOLERANCE)


def test_a_decode_from_the_paged_cache_matches_the_full_forward(
    own, pool, reference_model, tokenizer
):
    input_ids = tokenizer("Paged attention keeps keys and values in", return_tensors="pt")
    input_ids = input_ids.input_ids[0]
    t = len(input_ids)
    with torch.inference_mode():
        ref = reference_model(input_ids=input_ids[None]).logits[0, -1]
        prefill = paged_context(own, pool, t - 1, t - 1)
        own.model(input_ids[:-1], torch.arange(t - 1), prefill, torch.tensor([0]))
        decode = paged_context(own, pool, 1, t)
        logits = own.model(input_ids[-1:], torch.tensor([t - 1]), decode, torch.tensor([0]))
    torch.testing.assert_close(logits[0], ref, **TOLERANCE)
    assert int(logits[0].argmax()) == int(ref.argmax())
