"""The CPU KV pool in shared memory (worker_svc/shared_kv_memory.py): a memfd the pool's
tensor lives in, zeroed as the private pool is; huge pages reported only where the
kernel's shmem setting lets madvise have them."""

from __future__ import annotations

import pytest
import torch

from worker_svc import shared_kv_memory
from worker_svc.kv_pool import KVPool, KVPoolSpec

SPEC = KVPoolSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float16)


def test_a_shared_pool_lives_in_its_memfd_and_starts_zeroed():
    pool = KVPool(SPEC, 64, shared=True)
    memory = pool.shared_memory
    assert memory is not None and memory.nbytes == pool.num_bytes
    assert not pool.cache.any()
    pool.cache[1, 0, 5] = 1.5
    # The same bytes through the memfd's own mapping: the tensor is a view of it.
    as_mapped = torch.frombuffer(memory.memory, dtype=torch.float16, count=pool.cache.numel())
    assert torch.equal(as_mapped.view(pool.cache.shape), pool.cache)
    assert KVPool(SPEC, 64).shared_memory is None


@pytest.mark.parametrize(
    ("top", "own", "allowed"),
    [
        ("always within_size advise [never] deny force", "always [inherit] advise never", False),
        ("always within_size [advise] never deny force", "always [inherit] advise never", True),
        ("always within_size advise [never] deny force", "always inherit [advise] never", True),
        ("[always] within_size advise never deny force", None, True),
        (None, None, False),
    ],
)
def test_shmem_huge_pages_follow_the_kernel_setting(tmp_path, monkeypatch, top, own, allowed):
    if top is not None:
        (tmp_path / "shmem_enabled").write_text(top + "\n")
    if own is not None:
        (tmp_path / "hugepages-2048kB").mkdir()
        (tmp_path / "hugepages-2048kB" / "shmem_enabled").write_text(own + "\n")
    monkeypatch.setattr(shared_kv_memory, "_THP", tmp_path)
    assert shared_kv_memory.shmem_huge_pages_allowed() is allowed
