"""GGUF's weight blocks, and the C kernel that multiplies float32 activations by them
(kernels/qblock_gemm.c's panels with the float tiles of kernels/qblock_tiles.c and the
per-format unpacking of kernels/qblock_q4q8.c and kernels/qblock_kquants*.c, built at
first use, cached by CPU flags), and the large-M VNNI kernel (kernels/qblock_vnni.c,
kernels/qblock_kquants_vnni.c).

A weight `[N, K]` is kept as its blocks: a uint8 tensor `[N, fmt.row_bytes(K)]`,
row by row as GGUF stores it, so rows can be concatenated (fused QKV, gate/up) or
permuted (the rotary reordering of q and k) without touching a block.

- Q4_1: 20 bytes per 32 weights (f16 scale d, f16 minimum m, 16 bytes of nibbles),
  w = d * q + m. The shipped model's projections.
- Q8_0: 34 bytes per 32 weights (f16 scale d, 32 int8), w = d * q. The shipped model's
  tied embedding / LM head, and what a float-only model is quantized to at load.
- Q4_K, Q5_K, Q6_K (super-blocks of 256 weights, sub-block scales of 6 or 8 bits) and
  Q5_0 (32 weights, 5 bits): what llama.cpp's K-quant files (Q4_K_M, ...) hold, read
  as they are in the file (layouts in kernels/qblock_kquants.h): unpacked in registers
  at small M (plain C, AVX2 and AVX-512 variants), and read by the VNNI kernel at large
  M. `quantize` does not write them: they come from files only.
- F16 and BF16: 16-bit floats (a file converted with --outtype f16 / bf16, or a
  bfloat16 checkpoint's own values), widened exactly to float32 in registers
  (kernels/qblock_float16.c); products are float32 weights times float32 activations.
- MXFP4: 17 bytes per 32 weights (an E8M0 power of two, 16 bytes of 4-bit E2M1 codes;
  kernels/qblock_mxfp4.h): gpt-oss's experts, read as stored (plain C, AVX2, AVX-512
  and the VNNI kernel, whose int16 take the codes' integers exactly).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from worker_svc.native_build import KernelUnavailableError, build_and_load_parts

KERNELS = Path(__file__).with_name("kernels")
SOURCE = KERNELS / "qblock_gemm.c"
# No -ffast-math: w = d * q + m must round as gguf's dequantizer rounds it (the plain
# C sums vectorize through `omp simd reduction` instead).
COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-std=gnu11")
LINK_FLAGS = ("-shared", "-fopenmp")
# The block kernel's objects: whoever links it (the native decode step) links them all.
PARTS = tuple(
    (KERNELS / name, COMPILE_FLAGS)
    for name in (
        "qblock_gemm.c",
        "qblock_tiles.c",
        "qblock_q4q8.c",
        "qblock_kquants.c",
        "qblock_kquants_avx2.c",
        "qblock_kquants_avx512.c",
        "qblock_float16.c",
        "qblock_mxfp4.c",
    )
)
QK = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str
    code: int  # the kernel's format argument (kernels/qblock_gemm.h QBLOCK_FORMAT_*)
    block_bytes: int
    block_weights: int = QK  # a block's (or super-block's) weights: K is a multiple
    vnni: bool = False  # the large-M VNNI kernel (kernels/qblock_vnni.c) reads it (F16, BF16 not)

    def row_bytes(self, k: int) -> int:
        return k // self.block_weights * self.block_bytes


Q4_1 = BlockFormat("Q4_1", 0, 20, vnni=True)
Q8_0 = BlockFormat("Q8_0", 1, 34, vnni=True)
Q4_K = BlockFormat("Q4_K", 2, 144, 256, vnni=True)
Q5_K = BlockFormat("Q5_K", 3, 176, 256, vnni=True)
Q6_K = BlockFormat("Q6_K", 4, 210, 256, vnni=True)
Q5_0 = BlockFormat("Q5_0", 5, 22, vnni=True)
# 16-bit floats, 32 to a "block" of 64 bytes: a row is the file's K * 2 bytes.
F16 = BlockFormat("F16", 6, 64)
BF16 = BlockFormat("BF16", 7, 64)
MXFP4 = BlockFormat("MXFP4", 8, 17, vnni=True)
FORMATS = {f.name: f for f in (Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, Q5_0, F16, BF16, MXFP4)}
# The kernel's variant argument; AUTO takes the best this CPU runs.
VARIANTS = {"auto": 0, "plain": 1, "avx2": 2, "avx512": 3}


@functools.cache
def load_qblock_kernel() -> ctypes.CDLL:
    """The compiled kernel; KernelUnavailableError says why not."""
    lib = build_and_load_parts("qblock_gemm", PARTS, LINK_FLAGS)
    lib.qblock_gemm.restype = ctypes.c_int
    lib.qblock_gemm.argtypes = (
        [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    )
    lib.qblock_dequantize.restype = ctypes.c_int
    lib.qblock_dequantize.argtypes = (
        [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    )
    lib.qblock_supported_variants.restype = ctypes.c_int
    return lib


# The VNNI kernel's own objects: Q4_1 / Q8_0 / MXFP4 (qblock_vnni.c), the K-quants' and Q5_0's
# panel packing (qblock_kquants_vnni.c) and Q5_0's, Q4_K's and Q6_K's small-M tiles
# (qblock_kquants_small_vnni.c); linked with PARTS. With them, BF16 rows' vdpbf16ps
# panels (qblock_bf16_panel.c, compute/qblock_bf16_panel.py), which the native step reads.
VNNI_PARTS = tuple(
    (KERNELS / name, COMPILE_FLAGS)
    for name in (
        "qblock_vnni.c",
        "qblock_vnni8.c",  # Q4_1 x 8-bit activation blocks (vpdpbusd)
        "qblock_kquants_vnni.c",
        "qblock_kquants_small_vnni.c",
        "qblock_bf16_panel.c",
    )
)


@functools.cache
def load_vnni_kernel() -> ctypes.CDLL | None:
    """The large-M kernel (blocks x 16-bit activation blocks), or None where the CPU has
    no AVX-512 VNNI or it cannot be built."""
    try:
        # With the block kernel's parts: the K-quants' packing reads their half table.
        lib = build_and_load_parts("qblock_vnni", (*PARTS, *VNNI_PARTS), LINK_FLAGS)
    except KernelUnavailableError:
        return None
    if not lib.qblock_vnni_supported():
        return None
    lib.qblock_vnni_gemm.restype = ctypes.c_int
    lib.qblock_vnni_gemm.argtypes = (
        [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    )
    return lib


def vnni_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: BlockFormat, k: int) -> torch.Tensor:
    """x `[M, K]` float32 @ W.T, with x quantized to 16 bits per block of 32 and integer
    dot products (kernels/qblock_vnni.c), for the formats with `vnni`. Needs
    load_vnni_kernel()."""
    if not fmt.vnni:
        raise ValueError(f"the VNNI kernel does not read {fmt.name}")
    x = x.contiguous()
    out = torch.empty((x.shape[0], blocks.shape[0]), dtype=torch.float32)
    status = load_vnni_kernel().qblock_vnni_gemm(
        fmt.code,
        blocks.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        blocks.shape[0],
        k,
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"qblock_vnni_gemm failed ({status})")
    return out


def supported_variants() -> list[str]:
    """The kernel variants this CPU runs, plain C always among them."""
    mask = load_qblock_kernel().qblock_supported_variants()
    return [name for name, code in VARIANTS.items() if code and mask & (1 << code)]


def qblock_matmul(
    x: torch.Tensor, blocks: torch.Tensor, fmt: BlockFormat, k: int, variant: str = "auto"
) -> torch.Tensor:
    """x `[M, K]` float32 @ W.T, W `[N, K]` given as its blocks -> `[M, N]` float32."""
    x = x.contiguous()
    if x.dtype != torch.float32 or x.shape[-1] != k:
        raise ValueError(f"x must be float32 [M, {k}], got {x.dtype} {tuple(x.shape)}")
    n = blocks.shape[0]
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    status = load_qblock_kernel().qblock_gemm(
        fmt.code,
        VARIANTS[variant],
        blocks.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        n,
        k,
        torch.get_num_threads(),
    )
    if status != 0:
        reasons = {-1: f"variant {variant!r} does not run on this CPU", -2: "bad shape"}
        raise RuntimeError(f"qblock_gemm: {reasons.get(status, 'out of memory')}")
    return out


# Rows of W dequantized at a time by dense_matmul: about 4 MB of float32, so a chunk is
# still in cache when torch's GEMM reads it.
DENSE_CHUNK_FLOATS = 1 << 20


def dense_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: BlockFormat, k: int) -> torch.Tensor:
    """The large-M strategy: W dequantized a chunk of rows at a time (threads over rows),
    each chunk multiplied by torch's float32 GEMM. Same weights as qblock_matmul; no
    float32 copy of W outlives the call."""
    rows = max(1, DENSE_CHUNK_FLOATS // k)
    threads = torch.get_num_threads()
    parts = [
        torch.nn.functional.linear(
            x, dequantize(blocks[start : start + rows], fmt, "auto", threads)
        )
        for start in range(0, blocks.shape[0], rows)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def dequantize(
    blocks: torch.Tensor, fmt: BlockFormat, variant: str = "plain", threads: int = 1
) -> torch.Tensor:
    """Blocks `[N, B]` -> float32 `[N, K]`, each weight as gguf's dequantizer computes it
    (plain C by default: the reference the vector variants are tested against)."""
    blocks = blocks.contiguous()
    n, k = blocks.shape[0], blocks.shape[1] // fmt.block_bytes * fmt.block_weights
    out = torch.empty((n, k), dtype=torch.float32)
    status = load_qblock_kernel().qblock_dequantize(
        fmt.code, VARIANTS[variant], blocks.data_ptr(), out.data_ptr(), n, k, threads
    )
    if status != 0:
        raise ValueError(f"blocks of shape {tuple(blocks.shape)} are not whole {fmt.name} rows")
    return out


def quantize(weight: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """float `[N, K]` (K a multiple of 32) -> blocks `[N, K / 32 * block_bytes]` uint8
    (Q4_1, Q8_0, and F16 / BF16 as 16-bit floats).

    The scale is rounded to float16 before the weights are divided by it, so that each
    stored integer is the nearest one for the scale the kernel will multiply by."""
    n, k = weight.shape
    if fmt not in (Q4_1, Q8_0, F16, BF16):
        raise ValueError(f"{fmt.name} blocks are read from files, not written here")
    if k % QK:
        raise ValueError(f"K = {k} is not a multiple of {QK}")
    if fmt in (F16, BF16):  # rounded to nearest even; exact for weights already in it
        half = weight.detach().to(torch.float16 if fmt is F16 else torch.bfloat16)
        return half.contiguous().view(torch.uint8).reshape(n, 2 * k).clone()
    w = weight.detach().float().reshape(n, k // QK, QK)
    if fmt is Q8_0:
        d = (w.abs().amax(dim=-1, keepdim=True) / 127).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros(()))
        q = (w * inv).round().clamp(-127, 127).to(torch.int8)
        head = d.view(torch.uint8).reshape(n, k // QK, 2)
        return torch.cat([head, q.view(torch.uint8)], dim=-1).reshape(n, -1).contiguous()
    low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    m = low.half()
    d = ((high - m.float()) / 15).half()
    inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros(()))
    q = ((w - m.float()) * inv).round().clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    head = torch.cat([d.view(torch.uint8), m.view(torch.uint8)], dim=-1).reshape(n, k // QK, 4)
    return torch.cat([head, packed], dim=-1).reshape(n, -1).contiguous()


__all__ = [
    "BF16",
    "F16",
    "FORMATS",
    "MXFP4",
    "Q4_1",
    "Q4_K",
    "Q5_0",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "BlockFormat",
    "KernelUnavailableError",
    "dense_matmul",
    "dequantize",
    "qblock_matmul",
    "quantize",
    "supported_variants",
]
