"""Attention sinks (gpt-oss) on every CPU backend against transformers' own eager
attention for gpt-oss, on random queries, keys, values and sinks: several sequences in
one flat batch, prefill chunks from position 0 and past it, and enough decodes of
spread lengths for the torch backend's several decode groups, with and without a
sliding window, over float32 and 16-bit pools."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from worker_svc.attention import (
    BatchLayout,
    CpuAttentionBackend,
    PagedAttentionContext,
    TorchAttentionBackend,
)
from worker_svc.attention.cpu_kernel import paged_decode_attention
from worker_svc.attention.flash_backend import FlashAttentionBackend
from worker_svc.attention.sinks import attend_chunk_with_sinks
from worker_svc.attention.torch_backend import MIN_DECODE_GROUP
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.models.forward import compiled

HEADS, KV_HEADS, BLOCK, NUM_BLOCKS = 6, 2, 4, 160
SCALE = 0.3


def transformers_reference(q, k, v, sinks, window):
    """transformers' gpt-oss eager attention over one whole sequence: q `[L, H, d]`,
    k/v `[L, KV, d]` -> `[L, H, d]`, causal, within `window` when given."""
    length = q.shape[0]
    pos = torch.arange(length)
    delta = pos[:, None] - pos[None, :]
    seen = (delta >= 0) & (delta < window) if window else delta >= 0
    mask = torch.zeros(length, length).masked_fill(~seen, torch.finfo(torch.float32).min)
    module = types.SimpleNamespace(
        num_key_value_groups=HEADS // KV_HEADS, sinks=sinks, training=False
    )
    out, _ = eager_attention_forward(
        module,
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        mask[None, None],
        SCALE,
    )
    return out[0]


class Sequence:
    def __init__(self, length, head_dim, blocks, gen, kv_dtype, sinks, window):
        self.q = torch.randn(length, HEADS, head_dim, generator=gen)
        self.k = torch.randn(length, KV_HEADS, head_dim, generator=gen)
        self.v = torch.randn(length, KV_HEADS, head_dim, generator=gen)
        self.blocks = blocks
        stored_k, stored_v = (x.to(kv_dtype).float() for x in (self.k, self.v))
        self.expected = transformers_reference(self.q, stored_k, stored_v, sinks, window)
        self.done = 0


def run_step(backend, pool, chunks, sinks, window):
    """chunks: (sequence, length) from each sequence's next token -> per-chunk outputs."""
    layout = BatchLayout(
        query_lens=tuple(n for _, n in chunks),
        context_lens=tuple(seq.done + n for seq, n in chunks),
        block_tables=tuple(tuple(seq.blocks) for seq, _ in chunks),
        block_size=BLOCK,
    )
    meta = backend.build_metadata(layout, torch.device("cpu"))

    def flat(name):
        return torch.cat([getattr(seq, name)[seq.done : seq.done + n] for seq, n in chunks])

    out = backend.forward(
        0, flat("q"), flat("k"), flat("v"), pool, meta, SCALE, window=window, sinks=sinks
    )
    return out.split(list(layout.query_lens))


BACKEND_POOLS = [
    (TorchAttentionBackend, torch.float32),
    (TorchAttentionBackend, torch.float16),
    (TorchAttentionBackend, torch.bfloat16),
    (CpuAttentionBackend, torch.float32),
    (CpuAttentionBackend, torch.float16),
]


@pytest.mark.parametrize(
    ("backend_class", "kv_dtype"),
    [pytest.param(b, d, id=f"{b.name}-{str(d).removeprefix('torch.')}") for b, d in BACKEND_POOLS],
)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("head_dim", [16, 64])  # 64: the AVX-512 float16 kernel, where built
def test_sinks_match_transformers_eager(backend_class, kv_dtype, window, head_dim):
    gen = torch.Generator().manual_seed(head_dim + (window or 0))
    # Large sinks take a visible share of each softmax: a lost sink fails by far.
    sinks = 2.0 * torch.randn(HEADS, generator=gen)
    pool = KVPool(KVPoolSpec(1, KV_HEADS, head_dim, BLOCK, kv_dtype), NUM_BLOCKS)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    lengths = [3, 9, 17, 24, 31, 40, 12, 6, 28, 19, 35, 2]
    assert len(lengths) > MIN_DECODE_GROUP  # spread lengths: several decode groups
    seqs = [
        Sequence(
            n, head_dim, [free.pop() for _ in range(-(-n // BLOCK))], gen, kv_dtype, sinks, window
        )
        for n in lengths
    ]
    backend = backend_class()
    # Step 1: each sequence's first chunk (a third); step 2: the next third, a chunk
    # starting past position 0; then one decode per sequence a step, all in one batch.
    while any(seq.done < len(seq.q) for seq in seqs):
        chunks = []
        for seq in seqs:
            left = len(seq.q) - seq.done
            if left:
                n = max(1, len(seq.q) // 3) if seq.done < 2 * len(seq.q) // 3 else 1
                chunks.append((seq, min(n, left)))
        for (seq, n), got in zip(
            chunks, run_step(backend, pool, chunks, sinks, window), strict=True
        ):
            expected = seq.expected[seq.done : seq.done + n]
            torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
            seq.done += n


def test_the_sink_changes_the_output_and_a_very_low_one_changes_nothing():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(9, HEADS, 16, generator=gen)
    k, v = torch.randn(9, KV_HEADS, 16, generator=gen), torch.randn(9, KV_HEADS, 16, generator=gen)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    with_sinks = attend_chunk_with_sinks(q, k, v, mask, SCALE, torch.zeros(HEADS))
    without = attend_chunk_with_sinks(q, k, v, mask, SCALE, torch.full((HEADS,), -1e4))
    plain = transformers_reference(q, k, v, torch.full((HEADS,), -1e4), None)
    torch.testing.assert_close(without, plain, rtol=1e-5, atol=1e-5)
    assert (with_sinks - without).abs().max() > 0.05


def test_the_kernel_takes_sinks_of_any_float_dtype_and_checks_their_shape():
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(4, BLOCK, KV_HEADS, 16, generator=gen)
    q = torch.randn(2, HEADS, 16, generator=gen)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([7, 5], dtype=torch.int32)
    sinks = torch.randn(HEADS, generator=gen)
    as_float = paged_decode_attention(q, k_cache, k_cache, tables, lens, SCALE, sinks=sinks)
    as_half = paged_decode_attention(q, k_cache, k_cache, tables, lens, SCALE, sinks=sinks.half())
    rounded = paged_decode_attention(
        q, k_cache, k_cache, tables, lens, SCALE, sinks=sinks.half().float()
    )
    torch.testing.assert_close(as_half, rounded, rtol=0, atol=0)
    assert not torch.equal(
        as_float, paged_decode_attention(q, k_cache, k_cache, tables, lens, SCALE)
    )
    with pytest.raises(ValueError, match="sinks must be"):
        paged_decode_attention(q, k_cache, k_cache, tables, lens, SCALE, sinks=sinks[:3])


def test_which_backends_take_sinks():
    assert TorchAttentionBackend.supports_sinks and CpuAttentionBackend.supports_sinks
    assert not FlashAttentionBackend.supports_sinks


def test_the_compiled_forwards_attention_op_passes_the_sinks_through():
    gen = torch.Generator().manual_seed(5)
    layout = BatchLayout((6, 1), (6, 9), ((0, 1), (2, 3, 4)), BLOCK)
    q = torch.randn(7, HEADS, 16, generator=gen)
    k, v = torch.randn(7, KV_HEADS, 16, generator=gen), torch.randn(7, KV_HEADS, 16, generator=gen)
    sinks = torch.randn(HEADS, generator=gen)
    outputs = []
    for through_op in (False, True):
        backend = TorchAttentionBackend()
        pool = KVPool(KVPoolSpec(1, KV_HEADS, 16, BLOCK, torch.float32), 8)
        meta = backend.build_metadata(layout, torch.device("cpu"))
        if not through_op:
            outputs.append(backend.forward(0, q, k, v, pool, meta, SCALE, 4, sinks=sinks))
            continue
        compiled._STEP.append(PagedAttentionContext(backend, pool, meta))
        try:
            outputs.append(compiled._OpBackend().forward(0, q, k, v, None, None, SCALE, 4, sinks))
        finally:
            compiled._STEP.pop()
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
