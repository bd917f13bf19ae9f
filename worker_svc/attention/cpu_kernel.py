"""Builds and loads the C paged-decode kernel (kernels/paged_decode.c) for CPU workers.

The kernel is compiled on the machine that runs it, with `-march=native`, at first
use and cached by CPU flags (worker_svc/native_build.py, shared with the block
kernel). It is loaded with ctypes after torch, so its OpenMP calls bind to the
libgomp torch already loaded and share its threads.

Where no compiler is found or the build fails, `load_kernel` raises
KernelUnavailableError with the reason, and the worker keeps the torch path.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from worker_svc.native_build import KernelUnavailableError, build_and_load

SOURCE = Path(__file__).with_name("kernels") / "paged_decode.c"
# -ffast-math only at compile time: linking with it would add crtfastmath.o, which
# flushes denormals to zero for the whole process (torch included) on older gcc.
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
LINK_FLAGS = ("-shared", "-fopenmp", "-lm")


@functools.cache
def load_kernel() -> ctypes.CDLL:
    """The compiled kernel, built on first use; KernelUnavailableError says why not."""
    lib = build_and_load(SOURCE, COMPILE_FLAGS, LINK_FLAGS)
    for function in (lib.paged_decode_attention, lib.paged_decode_attention_f16):
        function.restype = ctypes.c_int
        function.argtypes = (
            [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_void_p]
        )
    return lib


# The pool element types the kernel reads; queries and outputs are float32 always.
CACHE_DTYPES = (torch.float32, torch.float16)


def cpu_kernel_unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the kernel can serve this worker (compute `dtype`), else why not."""
    if device.type != "cpu":
        return f"the CPU kernel runs on the CPU, not {device.type}"
    if dtype != torch.float32:
        return f"the CPU kernel computes in float32 only, not {dtype}"
    try:
        load_kernel()
    except KernelUnavailableError as exc:
        return str(exc)
    return None


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """query `[D, H, d]` float32; caches `[blocks, bs, kv_heads, d]`, float32 or float16;
    block_tables `[D, max_blocks]` and context_lens `[D]` int32 -> `[D, H, d]` float32.
    With a sliding `window`, each query sees its last `window` keys only; with `sinks`
    (`[H]`, gpt-oss), each head's sink logit joins its softmax (attention/sinks.py)."""
    query = query.contiguous()
    if query.dtype != torch.float32:
        raise ValueError(f"query must be float32, not {query.dtype}")
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not tensor.is_contiguous() or tensor.dtype not in CACHE_DTYPES:
            raise ValueError(f"{name} must be a contiguous float32 or float16 tensor")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("block_tables and context_lens must be int32")
    # Held in names until the call returns: a temporary's memory could be freed first.
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    if sinks is not None:
        if sinks.shape != (num_heads,):
            raise ValueError(f"sinks must be [{num_heads}], not {list(sinks.shape)}")
        sinks = sinks.detach().to(torch.float32).contiguous()
    out = torch.empty_like(query)
    lib = load_kernel()
    kernel = (
        lib.paged_decode_attention_f16
        if k_cache.dtype == torch.float16
        else lib.paged_decode_attention
    )
    status = kernel(
        query.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        context_lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        block_tables.shape[1],
        window or 0,
        scale,
        sinks.data_ptr() if sinks is not None else None,
    )
    if status != 0:
        raise MemoryError("the CPU kernel could not allocate its score buffers")
    return out
