"""The VNNI kernel's panels packed once, when a weight is loaded (kernels/qblock_vnni_prepacked.c).

At every large-M call the VNNI kernel (kernels/qblock_vnni.c) widens each panel of 16
output rows to int16, transposes it into vpdpwssd's pairs and reads out its scales, then
multiplies the rows of x by it: the packing is the same at every call, and measured on
Zen 4 (1 thread, N=3072 K=576 Q4_1) it is 7-10% of a call at M = 64, more below. Packed
once here, a weight keeps beside its blocks

- `panels` int16 `[panels, K / 2, 16, 2]`: 2 bytes a weight,
- `scales` float32 `[panels, 2, K / 32, 16]` (each panel's d, then m): 8 bytes a block of 32,

(a last panel's missing rows zero, as the per-call packing writes them), and the large-M
calls read them: the same arithmetic on the same values, so the same result bit for bit.
For Q4_1, Q8_0 and MXFP4, whose panels qblock_vnni.c packs; the K-quants and Q5_0 pack
theirs at every call (kernels/qblock_kquants_vnni.c). CBSERVE_QBLOCK_PREPACK=0 keeps the
per-call packing and allocates nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from worker_svc.compute.qblock import MXFP4, Q4_1, Q8_0, QK, BlockFormat, load_vnni_kernel

PREPACK_ENV = "CBSERVE_QBLOCK_PREPACK"
PREPACKED_FORMATS = (Q4_1, Q8_0, MXFP4)
PANEL_ROWS = 16  # kernels/qblock_vnni.h QBLOCK_VNNI_PANEL_ROWS


def prepack_enabled() -> bool:
    """Whether weights get their panels packed at load (default on)."""
    return os.environ.get(PREPACK_ENV, "1").strip() != "0"


def prepacks(fmt: BlockFormat) -> bool:
    """Whether `fmt`'s panels are packed by qblock_vnni.c's packer (so can be prepacked)."""
    return fmt in PREPACKED_FORMATS


def panel_count(n: int) -> int:
    return -(-n // PANEL_ROWS)


def prepacked_bytes(n: int, k: int) -> int:
    """The bytes of a weight `[n, k]`'s prepacked panels and scales."""
    return panel_count(n) * PANEL_ROWS * (2 * k + 8 * (k // QK))


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    lib = load_vnni_kernel()
    if lib is None:
        return None
    lib.qblock_vnni_prepack.restype = ctypes.c_int
    lib.qblock_vnni_prepack.argtypes = (
        [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2
    ) + [ctypes.c_int]
    lib.qblock_vnni_prepacked_gemm.restype = ctypes.c_int
    lib.qblock_vnni_prepacked_gemm.argtypes = (
        [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    )
    return lib


def vnni_prepack(
    blocks: torch.Tensor, fmt: BlockFormat, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight's blocks `[N, fmt.row_bytes(K)]` -> (panels, scales) as the module
    docstring lays them out. Needs load_vnni_kernel()."""
    if not prepacks(fmt):
        raise ValueError(f"{fmt.name} panels are packed at every call, not prepacked")
    lib = _kernel()
    if lib is None:
        raise RuntimeError("the VNNI kernel does not run on this CPU")
    blocks = blocks.contiguous()
    count = panel_count(blocks.shape[0])
    panels = torch.empty((count, k // 2, PANEL_ROWS, 2), dtype=torch.int16)
    scales = torch.empty((count, 2, k // QK, PANEL_ROWS), dtype=torch.float32)
    status = lib.qblock_vnni_prepack(
        fmt.code,
        blocks.data_ptr(),
        blocks.shape[0],
        k,
        panels.data_ptr(),
        scales.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"qblock_vnni_prepack failed ({status})")
    return panels, scales


def vnni_prepacked_matmul(
    x: torch.Tensor, panels: torch.Tensor, scales: torch.Tensor, n: int, k: int
) -> torch.Tensor:
    """vnni_matmul (compute/qblock.py) of x `[M, K]` float32 on a weight `[n, K]`'s
    prepacked panels: bit for bit its result."""
    x = x.contiguous()
    if x.dtype != torch.float32 or x.shape[-1] != k or panels.shape[0] != panel_count(n):
        raise ValueError(f"x {x.dtype} {tuple(x.shape)} does not meet panels of [{n}, {k}]")
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    status = _kernel().qblock_vnni_prepacked_gemm(
        panels.data_ptr(),
        scales.data_ptr(),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        n,
        k,
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"qblock_vnni_prepacked_gemm failed ({status})")
    return out
