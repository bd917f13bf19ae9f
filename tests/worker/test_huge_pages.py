"""The KV pool asks Linux for huge pages before its first write, and stays all zeros."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from worker_svc.huge_pages import HUGE_PAGE_BYTES, advise_huge_pages
from worker_svc.kv_pool import KVPool, KVPoolSpec

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_takes_advice() -> bool:
    """Whether this kernel backs madvise(MADV_HUGEPAGE) memory with huge pages."""
    if not sys.platform.startswith("linux") or not THP_SETTING.exists():
        return False
    setting = THP_SETTING.read_text()
    return "[always]" in setting or "[madvise]" in setting


def test_a_pool_over_many_huge_pages_gets_the_advice_and_is_zero():
    spec = KVPoolSpec(4, 3, 64, 16, torch.float16)
    pool = KVPool(spec, 1024)  # 48 MiB
    assert pool.num_bytes > 4 * HUGE_PAGE_BYTES
    assert pool.huge_pages is thp_takes_advice()
    assert not pool.cache.any()


def test_too_small_or_not_on_the_cpu_gets_no_advice():
    assert advise_huge_pages(torch.empty(1024)) is False  # under one aligned huge page
    assert advise_huge_pages(torch.empty(0)) is False
    meta = torch.empty(HUGE_PAGE_BYTES, dtype=torch.uint8, device="meta")
    assert advise_huge_pages(meta) is False
