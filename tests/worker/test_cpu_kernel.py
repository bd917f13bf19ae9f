"""The C paged-decode kernel against SDPA, and how a worker picks its backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_svc.attention import (
    BackendUnavailableError,
    CpuAttentionBackend,
    TorchAttentionBackend,
    select_backend,
)
from worker_svc.attention.cpu_kernel import load_kernel, paged_decode_attention

CPU = torch.device("cpu")


def reference(q, k_cache, v_cache, tables, lens, scale):
    """Each sequence's keys gathered densely, one SDPA call per sequence."""
    outs = []
    for row, length in enumerate(lens.tolist()):
        blocks = tables[row, : -(-length // k_cache.shape[1])].long()
        k = k_cache[blocks].flatten(0, 1)[:length].transpose(0, 1)  # [kv_heads, L, d]
        v = v_cache[blocks].flatten(0, 1)[:length].transpose(0, 1)
        o = F.scaled_dot_product_attention(
            q[row].unsqueeze(1), k, v, scale=scale, enable_gqa=True
        )  # [heads, 1, d]
        outs.append(o.squeeze(1))
    return torch.stack(outs)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [
        (9, 3, 64, 16),
        (6, 2, 16, 4),
        (4, 4, 32, 8),
        (8, 1, 64, 1),
        (14, 2, 20, 5),
        # The AVX-512 float16 kernel's shapes: head_dim 64 in chunks of up to 4 query
        # heads (a group of 5 is 4 + 1), 128 in chunks of 2, blocks of 16 keys or fewer.
        (10, 2, 64, 16),
        (16, 2, 128, 16),
        (3, 1, 128, 12),
    ],
)
def test_kernel_matches_sdpa(heads, kv_heads, head_dim, block_size, cache_dtype):
    gen = torch.Generator().manual_seed(heads * head_dim + block_size)
    num_blocks, num_seqs = 400, 12
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    lens = torch.randint(1, 20 * block_size, (num_seqs,), generator=gen, dtype=torch.int32)
    lens[0] = 1  # one key only
    lens[1] = 3 * block_size  # ends exactly on a block boundary
    max_blocks = -(-int(lens.max()) // block_size)
    # Scattered blocks; the padding past a sequence's own blocks points anywhere.
    tables = torch.randperm(num_blocks, generator=gen)[: num_seqs * max_blocks]
    tables = tables.view(num_seqs, max_blocks).to(torch.int32)
    q = torch.randn(num_seqs, heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    got = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    # A float16 pool is read exactly (every half is a float32), so the reference
    # attends over the same values and only the order of rounding differs.
    want = reference(q, k_cache.float(), v_cache.float(), tables, lens, scale)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_non_contiguous_query_is_fine_and_bad_dtypes_are_refused():
    k_cache = torch.randn(4, 2, 1, 8)
    tables = torch.tensor([[0, 1]], dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    q = torch.randn(2, 1, 8).transpose(0, 1)  # [1, 2, 8], not contiguous
    got = paged_decode_attention(q, k_cache, k_cache, tables, lens, 1.0)
    torch.testing.assert_close(got, reference(q, k_cache, k_cache, tables, lens, 1.0))
    with pytest.raises(ValueError, match="int32"):
        paged_decode_attention(q, k_cache, k_cache, tables.long(), lens, 1.0)
    with pytest.raises(ValueError, match="float32 or float16"):
        paged_decode_attention(q, k_cache.double(), k_cache.double(), tables, lens, 1.0)
    with pytest.raises(ValueError, match="v_cache is torch.float16"):
        paged_decode_attention(q, k_cache, k_cache.half(), tables, lens, 1.0)
    with pytest.raises(ValueError, match="query must be float32"):
        paged_decode_attention(q.half(), k_cache, k_cache, tables, lens, 1.0)


def test_auto_picks_the_kernel_for_float32_on_the_cpu():
    load_kernel()  # builds here, or fails the test with the reason
    backend, why = select_backend("auto", CPU, torch.float32, 16, 64)
    assert isinstance(backend, CpuAttentionBackend) and why.startswith("auto (")
    backend, _ = select_backend("torch", CPU, torch.float32, 16, 64)
    assert type(backend) is TorchAttentionBackend


def test_auto_falls_back_to_torch_and_says_why():
    backend, why = select_backend("auto", CPU, torch.bfloat16, 16, 64)
    assert type(backend) is TorchAttentionBackend
    assert "float32 only" in why
    with pytest.raises(BackendUnavailableError, match="float32 only"):
        select_backend("cpu", CPU, torch.bfloat16, 16, 64)
