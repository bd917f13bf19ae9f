"""gpt-oss on the transformers fallback (its modules over the paged backends) against
transformers' own eager model on the same random checkpoint, sinks included: the paged
path passes each layer's sinks (`s_aux`) and window to the backend, so its logits are
transformers' through a whole prompt, a chunked prefill and decodes past the window.
Before the sinks were passed, this checkpoint's greedy tokens differed from transformers'
(issue 42)."""

from __future__ import annotations

import pytest
import torch

from bench.peers.random_weights import randomize
from worker_svc.attention import (
    BatchLayout,
    CpuAttentionBackend,
    PagedAttentionContext,
    TorchAttentionBackend,
)
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import load_model

pytestmark = pytest.mark.model

WINDOW = 8
PROMPT_LEN = 5 * WINDOW  # past the sliding layers' window
CPU = torch.device("cpu")
CLOSE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    import transformers as hf

    config = hf.GptOssConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        max_position_embeddings=512,
    )
    model = hf.GptOssForCausalLM(config)
    randomize(model, seed=42)  # sinks, router and expert biases too
    assert model.model.layers[0].self_attn.sinks.abs().max() > 0
    path = tmp_path_factory.mktemp("gpt-oss")
    model.save_pretrained(path)
    own = load_model(path, "float32", CPU, model_impl="transformers")
    reference = hf.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return own, reference


def prompt(seed: int, length: int = PROMPT_LEN) -> torch.Tensor:
    return torch.randint(0, 49152, (length,), generator=torch.Generator().manual_seed(seed))


def step(own, backend, pool, ids, start):
    q = ids.shape[0]
    layout = BatchLayout((q,), (start + q,), (tuple(range(16)),), 4)
    context = PagedAttentionContext(backend, pool, backend.build_metadata(layout, CPU))
    return own.model(ids, torch.arange(start, start + q), context, torch.arange(q))


def test_the_fallback_serves_it(pair):
    own, _ = pair
    assert own.model_impl == "transformers"


@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend])
def test_chunked_prefill_and_decodes_past_the_window_equal_transformers(pair, backend):
    own, reference = pair
    ids = prompt(2)
    spec = KVPoolSpec(own.num_layers, own.num_kv_heads, own.head_dim, 4, torch.float32)
    pool = KVPool(spec, 16)
    with torch.inference_mode():
        want = reference(input_ids=ids[None]).logits[0]
        whole = step(own, backend(), KVPool(spec, 16), ids, 0)
        parts = [
            step(own, backend(), pool, ids[:11], 0),
            step(own, backend(), pool, ids[11:24], 11),
        ]
        parts += [step(own, backend(), pool, ids[i : i + 1], i) for i in range(24, PROMPT_LEN)]
    torch.testing.assert_close(whole, want, **CLOSE)
    torch.testing.assert_close(torch.cat(parts), want, **CLOSE)
