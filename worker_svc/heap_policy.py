"""The worker's malloc policy: freed memory is kept for the next step, not given back.

A decode step allocates and frees the same buffers every time: the native step's
scratch (decode_step.c), the VNNI kernel's quantized activations (qblock_vnni.c),
torch's logits and the sampler's temporaries. glibc gives the free memory at a heap's
top back to the system once it passes M_TRIM_THRESHOLD (128 KB, raised dynamically
only by freed mappings), so the next step asks for the same pages again and the kernel
faults and zeroes them one 4 KB page at a time, step after step: 1-3% of a 64-prompt
step's cycles were `exc_page_fault` and `clear_page_erms` (perf). In a served run of 64
prompts on the shipped model the worker took 408,000 page faults without this policy and
149,000 with it, none after its first steps (README, "Malloc policy").

So the worker keeps up to `trim_threshold` bytes free at each heap's top, and serves
allocations below `mmap_threshold` (glibc's largest allowed value on 64-bit) from its
heaps instead of a mapping of their own that munmap hands back at every free. The cost
is that the worker's resident memory stays at its high-water mark, which a serving
process reaches within its first batch anyway.

mallopt is glibc's; elsewhere (musl, macOS) nothing is set. A user who set glibc's
own variables keeps them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
USER_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@dataclass(frozen=True)
class HeapPolicy:
    trim_threshold: int = 1 << 30
    mmap_threshold: int = 32 << 20

    def __post_init__(self) -> None:
        if not 0 < self.mmap_threshold <= 32 << 20:
            raise ValueError("mmap_threshold must be in (0, 32 MiB] (glibc's range on 64-bit)")
        if self.trim_threshold <= 0:
            raise ValueError("trim_threshold must be positive")


DEFAULT_HEAP_POLICY = HeapPolicy()


def apply_heap_policy(
    environ: Mapping[str, str] = os.environ,
    policy: HeapPolicy = DEFAULT_HEAP_POLICY,
    libc_name: str | None = None,
) -> dict[str, object]:
    """Sets the policy with mallopt unless the user set glibc's malloc variables; returns
    what is in effect and why (also kept for the worker's start log)."""
    global _applied
    _applied = _apply(environ, policy, libc_name)
    return _applied


def applied_heap_policy() -> dict[str, object] | None:
    """What apply_heap_policy did at this process's start (None: not called)."""
    return _applied


_applied: dict[str, object] | None = None


def _apply(environ: Mapping[str, str], policy: HeapPolicy, libc_name: str | None):
    user = [name for name in USER_VARIABLES if name in environ]
    if user:
        return {"policy": "glibc's, as set by the user", "variables": user}
    mallopt = _mallopt(libc_name)
    if mallopt is None:
        return {"policy": "the C library's defaults (no glibc mallopt)"}
    applied = mallopt(M_TRIM_THRESHOLD, policy.trim_threshold) == 1
    applied &= mallopt(M_MMAP_THRESHOLD, policy.mmap_threshold) == 1
    if not applied:
        return {"policy": "glibc's defaults (mallopt refused the policy)"}
    return {"trim_threshold": policy.trim_threshold, "mmap_threshold": policy.mmap_threshold}


def _mallopt(libc_name: str | None):
    try:
        libc = ctypes.CDLL(libc_name or ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
