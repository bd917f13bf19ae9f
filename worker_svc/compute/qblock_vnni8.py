"""Q4_1 weights times 8-bit activation blocks on AVX-512 VNNI's vpdpbusd
(kernels/qblock_vnni8.c): llama.cpp's q4_1 x q8_1 arithmetic, twice the 16-bit kernel's
products an instruction. Not every projection's input keeps the accuracy gate at 8 bits
(bench/micro/act8_accuracy.py measures which); the native decode step takes it only for
the projection kinds it is told to (models/qblock/native.py)."""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from worker_svc.compute.qblock import Q4_1, load_vnni_kernel

QK = 32


@functools.cache
def load_vnni8_kernel() -> ctypes.CDLL | None:
    """The VNNI library (it links qblock_vnni8.c) with this kernel's signatures, or None
    where the CPU has no AVX-512 VNNI or it cannot be built."""
    lib = load_vnni_kernel()
    if lib is None:
        return None
    lib.qblock_vnni8_gemm.restype = ctypes.c_int
    lib.qblock_vnni8_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.qblock_vnni8_quantize_rows.restype = None
    lib.qblock_vnni8_quantize_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [
        ctypes.c_void_p
    ] * 3
    lib.qblock_vnni8_reads.restype = ctypes.c_int
    lib.qblock_vnni8_reads.argtypes = [ctypes.c_int64]
    return lib


def vnni8_reads(k: int) -> bool:
    """Whether the kernel takes rows of K weights (a multiple of 64)."""
    lib = load_vnni8_kernel()
    return lib is not None and bool(lib.qblock_vnni8_reads(k))


def quantize_rows_8bit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x `[M, K]` float32 -> (qx int8 `[M, K]`, dx, sx float32 `[M, K / 32]`), as the
    kernel quantizes its input (for tests)."""
    x = x.contiguous()
    m, k = x.shape
    qx = torch.empty((m, k), dtype=torch.int8)
    dx = torch.empty((m, k // QK), dtype=torch.float32)
    sx = torch.empty_like(dx)
    load_vnni8_kernel().qblock_vnni8_quantize_rows(
        x.data_ptr(), m, k, qx.data_ptr(), dx.data_ptr(), sx.data_ptr()
    )
    return qx, dx, sx


def vnni8_matmul(x: torch.Tensor, blocks: torch.Tensor, k: int) -> torch.Tensor:
    """x `[M, K]` float32 @ W.T for W's Q4_1 rows `[N, row_bytes]`, x quantized to 8 bits
    per block of 32. Needs load_vnni8_kernel() and vnni8_reads(k)."""
    if blocks.dtype != torch.uint8 or blocks.shape[1] != Q4_1.row_bytes(k):
        raise ValueError(f"{tuple(blocks.shape)} {blocks.dtype} are not Q4_1 rows of {k}")
    x = x.contiguous()
    out = torch.empty((x.shape[0], blocks.shape[0]), dtype=torch.float32)
    status = load_vnni8_kernel().qblock_vnni8_gemm(
        blocks.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        blocks.shape[0],
        k,
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"qblock_vnni8_gemm failed ({status})")
    return out


# Which projection kinds take the kernel: CBSERVE_QBLOCK_ACT8, a comma-separated list of
# ACT8_KINDS ("" or "off": none). The LM head is not one: the shipped head is Q8_0.
ACT8_ENV = "CBSERVE_QBLOCK_ACT8"
ACT8_KINDS = ("qkv", "o", "gate_up", "down")
DEFAULT_ACT8 = ""


def act8_kinds(value: str | None = None) -> frozenset[str]:
    """The kinds named by `value` (default: the environment's, else DEFAULT_ACT8)."""
    if value is None:
        value = os.environ.get(ACT8_ENV, DEFAULT_ACT8)
    value = value.strip().lower()
    if value in ("", "off", "none", "0"):
        return frozenset()
    kinds = frozenset(part.strip() for part in value.split(",") if part.strip())
    unknown = sorted(kinds - set(ACT8_KINDS))
    if unknown:
        raise ValueError(f"{ACT8_ENV}: unknown projection kinds {unknown}; use {ACT8_KINDS}")
    return kinds


def enable_act8(projection) -> bool:
    """In place: a QBlockLinear of Q4_1 rows that takes the VNNI kernel multiplies by 8-bit
    activation blocks there; anything else (a stack of formats, another format, a K the
    kernel refuses, no VNNI) is left as it is. Returns whether it was enabled."""
    takes = (
        getattr(projection, "format", None) is Q4_1
        and getattr(projection, "vnni", False)
        and vnni8_reads(projection.in_features)
    )
    if takes:
        projection.act8 = True
    return bool(takes)
