"""Every declared architecture's own forward in float32 against transformers' own model
on the same random checkpoint: the logits of a whole prompt, the same prompt prefilled
in chunks and decoded from the paged cache past the sliding window (torch and CPU-kernel
backends, float32 and float16 pools), a prefix reused from another sequence's blocks,
and greedy generation token for token against `generate`."""

from __future__ import annotations

import pytest
import torch

from tests.worker.architectures.checkpoints import ARCHITECTURES, WINDOW
from worker_svc.attention import (
    BatchLayout,
    CpuAttentionBackend,
    PagedAttentionContext,
    TorchAttentionBackend,
)
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import load_model

pytestmark = pytest.mark.model

PROMPT_LEN = 5 * WINDOW  # past every window
CPU = torch.device("cpu")
# Same products, other sums (fused projections, the kernel's own softmax).
CLOSE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request, checkpoints):
    import transformers as hf

    path = checkpoints[request.param]
    own = load_model(path, "float32", CPU)
    reference = hf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, own, reference


def prompt(seed: int, length: int = PROMPT_LEN) -> torch.Tensor:
    return torch.randint(0, 49152, (length,), generator=torch.Generator().manual_seed(seed))


class Paged:
    """One sequence in blocks 0..15 of a pool, stepped through a backend."""

    def __init__(self, own, backend, kv_dtype=torch.float32):
        spec = KVPoolSpec(own.num_layers, own.num_kv_heads, own.head_dim, 4, kv_dtype)
        self.pool, self.backend, self.model = KVPool(spec, 32), backend, own.model

    def step(self, ids: torch.Tensor, start: int, table=tuple(range(16))) -> torch.Tensor:
        q = ids.shape[0]
        layout = BatchLayout((q,), (start + q,), (table,), 4)
        context = PagedAttentionContext(
            self.backend, self.pool, self.backend.build_metadata(layout, CPU)
        )
        positions = torch.arange(start, start + q)
        return self.model(ids, positions, context, torch.arange(q))


def test_the_own_forward_serves_it(pair):
    name, own, _ = pair
    assert own.model_impl == "cbserve", name
    declared_by = {"llama3": "llama", "ministral": "mistral"}
    assert own.architecture.name == declared_by.get(name, name)


def test_prompt_logits_equal_transformers(pair):
    _, own, reference = pair
    ids = prompt(1)
    with torch.inference_mode():
        want = reference(input_ids=ids[None]).logits[0]
        got = Paged(own, TorchAttentionBackend()).step(ids, 0)
    torch.testing.assert_close(got, want, **CLOSE)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend])
def test_chunked_prefill_and_decodes_past_the_window(pair, backend, kv_dtype):
    _, own, reference = pair
    ids = prompt(2)
    with torch.inference_mode():
        want = reference(input_ids=ids[None]).logits[0]
        paged = Paged(own, backend(), kv_dtype)
        parts = [paged.step(ids[:11], 0), paged.step(ids[11:24], 11)]
        parts += [paged.step(ids[i : i + 1], i) for i in range(24, PROMPT_LEN)]
    got = torch.cat(parts)
    if kv_dtype == torch.float32:
        torch.testing.assert_close(got, want, **CLOSE)
    else:  # K/V rounded to float16: the greedy choice, not every bit
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.95


def test_a_cached_prefix_from_another_sequence(pair):
    """A second sequence whose first blocks are the first's (a prefix-cache hit)
    computes only its own tokens and gets the logits of a full prefill."""
    _, own, reference = pair
    shared = prompt(3, 4 * WINDOW)
    tail = prompt(4, 12)
    with torch.inference_mode():
        want = reference(input_ids=torch.cat([shared, tail])[None]).logits[0, -12:]
        paged = Paged(own, CpuAttentionBackend())
        paged.step(shared, 0, table=tuple(range(16)))
        second = tuple(range(8)) + tuple(range(16, 24))  # blocks 0..7 hold `shared`
        got = paged.step(tail, len(shared), table=second)
    torch.testing.assert_close(got, want, **CLOSE)


def test_greedy_generation_equals_generate(pair):
    _, own, reference = pair
    ids = prompt(5, 3 * WINDOW)
    new = 2 * WINDOW
    with torch.inference_mode():
        want = reference.generate(
            ids[None], max_new_tokens=new, do_sample=False, min_new_tokens=new, pad_token_id=0
        )[0, len(ids) :]
        paged = Paged(own, CpuAttentionBackend())
        logits = paged.step(ids, 0)[-1]
        got = []
        for i in range(new):
            token = int(logits.argmax())
            got.append(token)
            logits = paged.step(torch.tensor([token]), len(ids) + i)[0]
    assert got == want.tolist()
