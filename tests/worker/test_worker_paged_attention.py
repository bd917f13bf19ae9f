"""The CPU paged-attention backends (torch, and torch with the C decode kernel) against
plain dense causal SDPA on random tensors; over a 16-bit pool (--kv-cache-dtype), against
dense SDPA on the K/V rounded to the pool's dtype."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_svc.attention import BatchLayout, CpuAttentionBackend, TorchAttentionBackend
from worker_svc.attention.torch_backend import (
    MIN_DECODE_GROUP,
    SCRATCH_BLOCK_SIZE,
    group_decodes,
    scratch_context,
)
from worker_svc.kv_pool import KVPool, KVPoolSpec

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 16, 4
# The C kernel is built here on first use; a machine without a C compiler fails these
# tests with the reason instead of skipping them.
BACKENDS = [TorchAttentionBackend, CpuAttentionBackend]
# Each backend with the pool dtypes it reads (the C kernel: float32 and float16).
BACKEND_POOLS = [
    pytest.param(backend, dtype, id=f"{backend.name}-{str(dtype).removeprefix('torch.')}")
    for backend, dtypes in (
        (TorchAttentionBackend, (torch.float32, torch.float16, torch.bfloat16)),
        (CpuAttentionBackend, (torch.float32, torch.float16)),
    )
    for dtype in dtypes
]


def dense_reference(q, k, v):
    """q `[L, H, d]`, k/v `[L, KV, d]` for one whole sequence -> `[L, H, d]`, causal."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


class Sequence:
    def __init__(
        self,
        length: int,
        blocks: list[int],
        gen: torch.Generator,
        kv_dtype: torch.dtype = torch.float32,
    ):
        self.q = torch.randn(length, HEADS, HEAD_DIM, generator=gen)
        self.k = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
        self.v = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
        self.blocks = blocks
        # What a pool of kv_dtype holds, read back in float32: every chunk attends to
        # these, a fresh prefill's own K/V included (torch_backend.as_stored).
        stored_k, stored_v = (x.to(kv_dtype).float() for x in (self.k, self.v))
        self.expected = dense_reference(self.q, stored_k, stored_v)


def run_step(backend, pool, chunks):
    """chunks: (sequence, start, length). Returns the per-chunk outputs `[length, H, d]`."""
    layout = BatchLayout(
        query_lens=tuple(n for _, _, n in chunks),
        context_lens=tuple(s + n for _, s, n in chunks),
        block_tables=tuple(tuple(seq.blocks) for seq, _, _ in chunks),
        block_size=BLOCK,
    )
    meta = backend.build_metadata(layout, torch.device("cpu"))

    def flat(name):
        return torch.cat([getattr(seq, name)[s : s + n] for seq, s, n in chunks])

    out = backend.forward(0, flat("q"), flat("k"), flat("v"), pool, meta, HEAD_DIM**-0.5)
    assert out.shape == (layout.num_tokens, HEADS, HEAD_DIM)
    return out.split(list(layout.query_lens))


@pytest.mark.parametrize(("backend_class", "kv_dtype"), BACKEND_POOLS)
@pytest.mark.parametrize(("seed", "decodes_first"), [(0, False), (1, True)])
def test_mixed_prefill_chunks_and_decodes_match_dense(seed, decodes_first, backend_class, kv_dtype):
    gen = torch.Generator().manual_seed(seed)
    spec = KVPoolSpec(1, KV_HEADS, HEAD_DIM, BLOCK, kv_dtype)
    pool = KVPool(spec, 64)
    # Scattered, non-contiguous block ids, in no particular order.
    free = torch.randperm(64, generator=gen).tolist()

    def blocks(n_tokens):
        return [free.pop() for _ in range(-(-n_tokens // BLOCK))]

    stored_as = functools.partial(Sequence, kv_dtype=kv_dtype)
    a = stored_as(23, blocks(23), gen)  # chunk 0..15, then chunk 16..22 (offset > 0)
    b = stored_as(10, blocks(10), gen)  # prefill 0..8, then a decode at 9
    c = stored_as(30, blocks(30), gen)  # prefill 0..28, then a decode at 29
    d = stored_as(5, blocks(5), gen)  # joins in step 2 with a whole fresh prefill
    e = stored_as(13, blocks(13), gen)  # chunk 0..2, then 3..12 (not block-aligned)
    f = stored_as(2, blocks(2), gen)  # one-token "prefill", then a decode

    backend = backend_class()
    step1 = [(a, 0, 16), (b, 0, 9), (c, 0, 29), (e, 0, 3), (f, 0, 1)]
    step2 = [(b, 9, 1), (a, 16, 7), (c, 29, 1), (d, 0, 5), (e, 3, 10), (f, 1, 1)]
    if decodes_first:  # the runner's order; the other order takes the indexed path
        step2.sort(key=lambda chunk: chunk[2] != 1)
    for step in (step1, step2):
        for (seq, start, n), got in zip(step, run_step(backend, pool, step), strict=True):
            torch.testing.assert_close(got, seq.expected[start : start + n], rtol=1e-5, atol=1e-5)


def test_writes_land_in_the_given_slots():
    spec = KVPoolSpec(2, KV_HEADS, HEAD_DIM, BLOCK, torch.float32)
    pool = KVPool(spec, 8)
    gen = torch.Generator().manual_seed(3)
    seq = Sequence(6, [5, 2], gen)
    backend = TorchAttentionBackend()
    layout = BatchLayout((6,), (6,), ((5, 2),), BLOCK)
    meta = backend.build_metadata(layout, torch.device("cpu"))
    backend.forward(1, seq.q, seq.k, seq.v, pool, meta, HEAD_DIM**-0.5)
    k_cache, v_cache = pool.layer(1)
    torch.testing.assert_close(k_cache[5], seq.k[:4])
    torch.testing.assert_close(v_cache[2, :2], seq.v[4:])
    assert pool.layer(0)[0].abs().sum() == 0  # other layers untouched


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_pool_holds_the_kv_rounded_to_nearest(kv_dtype):
    pool = KVPool(KVPoolSpec(1, KV_HEADS, HEAD_DIM, BLOCK, kv_dtype), 4)
    seq = Sequence(6, [3, 1], torch.Generator().manual_seed(4))
    backend = TorchAttentionBackend()
    meta = backend.build_metadata(BatchLayout((6,), (6,), ((3, 1),), BLOCK), torch.device("cpu"))
    out = backend.forward(0, seq.q, seq.k, seq.v, pool, meta, HEAD_DIM**-0.5)
    assert out.dtype == torch.float32  # the query's, not the pool's
    k_cache, v_cache = pool.layer(0)
    assert k_cache.dtype == kv_dtype
    assert torch.equal(k_cache[3], seq.k[:4].to(kv_dtype))
    assert torch.equal(v_cache[1, :2], seq.v[4:].to(kv_dtype))


@pytest.mark.parametrize("backend_class", BACKENDS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_schedules_match_dense(data, backend_class):
    """Any split of any sequences into chunks, in any batch order, equals dense attention."""
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=4), label="lengths")
    pool = KVPool(KVPoolSpec(1, KV_HEADS, HEAD_DIM, BLOCK, torch.float32), 64)
    free = torch.randperm(64, generator=gen).tolist()
    seqs = [Sequence(n, [free.pop() for _ in range(-(-n // BLOCK))], gen) for n in lengths]
    done = [0] * len(seqs)
    while any(d < len(s.q) for d, s in zip(done, seqs, strict=True)):
        step = []
        for i, seq in enumerate(seqs):
            left = len(seq.q) - done[i]
            n = data.draw(st.integers(0, left), label="chunk") if left else 0  # 0: not this step
            if n:
                step.append((seq, done[i], n))
                done[i] += n
        if not step:  # guarantee progress: the first unfinished sequence, to its end
            i = next(i for i, s in enumerate(seqs) if done[i] < len(s.q))
            step.append((seqs[i], done[i], len(seqs[i].q) - done[i]))
            done[i] = len(seqs[i].q)
        step = data.draw(st.permutations(step), label="order")
        outputs = run_step(backend_class(), pool, step)
        for (seq, start, n), got in zip(step, outputs, strict=True):
            torch.testing.assert_close(got, seq.expected[start : start + n], rtol=1e-5, atol=1e-5)


def test_decodes_are_grouped_by_context_length():
    # 20 decodes from 4 to 80 tokens (1 to 20 blocks of 4), given shortest first.
    lens = {i: 4 * (i + 1) for i in range(20)}
    groups = group_decodes(lens, BLOCK)
    assert sorted(i for group in groups for i in group) == list(range(20))
    assert groups[0][0] == 19  # longest first
    assert len(groups) > 1
    for group in groups[:-1]:
        assert len(group) >= MIN_DECODE_GROUP
    for group in groups:
        longest, shortest = lens[group[0]], lens[group[-1]]
        # Past the minimum size, a group takes only contexts above 3/4 of its longest.
        for i in group[MIN_DECODE_GROUP:]:
            assert lens[i] > 0.75 * longest
        assert shortest <= longest


@pytest.mark.parametrize("backend_class", BACKENDS)
@pytest.mark.parametrize("longest_first", [True, False])
def test_many_decodes_of_spread_lengths_match_dense(longest_first, backend_class):
    """Several decode groups, as adjacent slices (the runner's order) or scattered."""
    gen = torch.Generator().manual_seed(7)
    pool = KVPool(KVPoolSpec(1, KV_HEADS, HEAD_DIM, BLOCK, torch.float32), 256)
    free = torch.randperm(256, generator=gen).tolist()
    lengths = [3, 70, 9, 41, 2, 55, 17, 64, 5, 33, 28, 12, 48, 6, 22, 60, 4, 37, 15, 50]
    seqs = [Sequence(n, [free.pop() for _ in range(-(-n // BLOCK))], gen) for n in lengths]
    backend = backend_class()
    run_step(backend, pool, [(seq, 0, len(seq.q) - 1) for seq in seqs if len(seq.q) > 1])
    step = [(seq, len(seq.q) - 1, 1) for seq in seqs]
    if longest_first:
        step.sort(key=lambda chunk: -chunk[1])
    layout_groups = group_decodes({i: c[1] + 1 for i, c in enumerate(step)}, BLOCK)
    assert len(layout_groups) > 1
    for (seq, start, n), got in zip(step, run_step(backend, pool, step), strict=True):
        torch.testing.assert_close(got, seq.expected[start : start + n], rtol=1e-5, atol=1e-5)


def test_a_scratch_context_gives_each_sequence_blocks_of_its_own():
    context = scratch_context(2, 3, 8, torch.float32, (20, 1))
    assert context.pool.num_blocks == 3 and context.pool.block_size == SCRATCH_BLOCK_SIZE
    t = 21
    query = torch.randn(t, 6, 8)
    key, value = torch.randn(t, 3, 8), torch.randn(t, 3, 8)
    out = context.backend.forward(1, query, key, value, context.pool, context.metadata, 0.5)
    assert out.shape == (t, 6, 8)
    # The first sequence's K went to blocks 0-1 of layer 1, the second's to block 2.
    written = context.pool.cache[1, 0].reshape(-1, 3, 8)
    torch.testing.assert_close(written[:20], key[:20])
    torch.testing.assert_close(written[2 * SCRATCH_BLOCK_SIZE], key[20])
