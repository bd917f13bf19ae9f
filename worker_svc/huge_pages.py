"""Transparent huge pages for the worker's large CPU tensors (the KV pool).

A decode's attention reads each sequence's KV blocks where the scheduler put them,
scattered over a pool of hundreds of megabytes: with 4 KiB pages nearly every block is a
TLB miss and a page walk. Linux backs memory with 2 MiB pages when asked
(madvise(MADV_HUGEPAGE)) on the usual "madvise" setting of
/sys/kernel/mm/transparent_hugepage/enabled. Measured on an Ice Lake Xeon, one layer of
64 decodes over a float16 pool of 755 MB: 2.18 -> 1.96 ms with 2 threads, 4.35 -> 3.77
ms with one (bench/RESULTS.md).

The advice must come before the pages are first touched, so callers allocate with
torch.empty, advise, then fill. Where the kernel has no THP, or is not Linux, nothing
changes: the advice is a hint and its failure is not an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import torch

MADV_HUGEPAGE = 14  # linux/mman.h
HUGE_PAGE_BYTES = 2 << 20


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    function = libc.madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Asks for 2 MiB pages under a CPU tensor's whole 2 MiB-aligned interior; True when
    the kernel took the advice. Call it before the tensor's memory is first written."""
    madvise = _madvise()
    if madvise is None or tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last <= first:
        return False  # smaller than one aligned huge page: nothing to gain
    return madvise(first, last - first, MADV_HUGEPAGE) == 0
