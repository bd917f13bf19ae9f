"""BF16 rows times activations rounded to bfloat16, in the own vdpbf16ps panels
(kernels/qblock_bf16_panel.c): what the native decode step runs for a bfloat16
checkpoint's projections from bf16_gemm_from_m rows (models/qblock/native.py), here for
its tests and the roofline. Only where the CPU has AVX-512 BF16."""

from __future__ import annotations

import ctypes
import functools

import torch

from worker_svc.compute.qblock import load_vnni_kernel


@functools.cache
def load_bf16_panel_kernel() -> ctypes.CDLL | None:
    """The kernel, or None where the CPU has no AVX-512 BF16 or it cannot be built: one
    of the VNNI library's parts (qblock.VNNI_PARTS), as in the native step, so it is
    not built twice (every CPU with AVX-512 BF16 has VNNI)."""
    lib = load_vnni_kernel()
    if lib is None or not lib.qblock_bf16_supported():
        return None
    lib.qblock_bf16_gemm.restype = ctypes.c_int
    lib.qblock_bf16_gemm.argtypes = (
        [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2
    )
    return lib


def bf16_panel_matmul(
    x: torch.Tensor, blocks: torch.Tensor, threads: int | None = None, round_output: bool = False
):
    """x `[M, K]` float32, rounded to bfloat16, @ W.T for W's BF16 rows `[N, 2K]` uint8 ->
    `[M, N]` float32 (float32 sums; with `round_output`, each rounded to bfloat16 as
    torch's bfloat16 GEMM writes it: what the native step runs). Needs
    load_bf16_panel_kernel()."""
    x = x.contiguous()
    k = blocks.shape[1] // 2
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k or blocks.dtype != torch.uint8:
        raise ValueError(f"x must be float32 [M, {k}] for uint8 rows, got {tuple(x.shape)}")
    blocks = blocks.contiguous()
    out = torch.empty((x.shape[0], blocks.shape[0]), dtype=torch.float32)
    status = load_bf16_panel_kernel().qblock_bf16_gemm(
        blocks.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        blocks.shape[0],
        k,
        int(round_output),
        threads or torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"qblock_bf16_gemm failed ({status})")
    return out
