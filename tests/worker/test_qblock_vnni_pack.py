"""The VNNI kernel's Q4_1 / Q8_0 / MXFP4 panel packer (compute/kernels/qblock_vnni_pack.h):
each packed pair and scale against the weights the plain dequantizer computes."""

from __future__ import annotations

import ctypes

import pytest
import torch

from worker_svc.compute.qblock import MXFP4, Q4_1, Q8_0, dequantize, load_vnni_kernel, quantize

pytestmark = pytest.mark.skipif(load_vnni_kernel() is None, reason="no AVX-512 VNNI here")

LANES = 16


def blocks_of(fmt, rows: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if fmt is not MXFP4:
        return quantize(torch.randn(rows, k, generator=gen), fmt)
    blocks = torch.randint(0, 256, (rows, k // 32, MXFP4.block_bytes), generator=gen)
    blocks[..., 0] = torch.randint(100, 150, (rows, k // 32), generator=gen)  # finite scales
    return blocks.to(torch.uint8).reshape(rows, -1).contiguous()


def packed(fmt, blocks: torch.Tensor, rows: int, k: int):
    """(per-row int16 weights [16, k] as the pairs hold them, scales [16, k / 32], minimums)"""
    wq = torch.full((k // 2, LANES, 2), 7, dtype=torch.int16)  # not zero: missing rows must be
    wd = torch.full((k // 32, LANES), 7.0)
    wm = torch.full((k // 32, LANES), 7.0)
    load_vnni_kernel().qblock_vnni_pack_panel(
        ctypes.c_int(fmt.code),
        ctypes.c_void_p(blocks.data_ptr()),
        ctypes.c_int64(blocks.shape[1]),
        ctypes.c_int64(rows),
        ctypes.c_int64(k),
        ctypes.c_void_p(wq.data_ptr()),
        ctypes.c_void_p(wd.data_ptr()),
        ctypes.c_void_p(wm.data_ptr()),
    )
    return wq.permute(1, 0, 2).reshape(LANES, k), wd.T, wm.T


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0, MXFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("rows", [16, 5])
@pytest.mark.parametrize("k", [32, 576])
def test_pairs_and_scales_rebuild_the_dequantized_rows(fmt, rows, k):
    """Vector k2 holds weights 2 k2 and 2 k2 + 1 of every row (a nibble or word sent to the
    wrong pair shows as a wrong weight); rows past `rows` are zeros, scales included."""
    blocks = blocks_of(fmt, rows, k, seed=rows * 1000 + k + fmt.code)
    q, d, m = packed(fmt, blocks, rows, k)
    rebuilt = d.repeat_interleave(32, dim=1) * q.float() + m.repeat_interleave(32, dim=1)
    assert torch.equal(rebuilt[:rows], dequantize(blocks, fmt))
    assert not q[rows:].any() and not d[rows:].any() and not m[rows:].any()
    if fmt is not Q4_1:
        assert not m.any()
    if fmt is Q4_1:
        assert q.min() >= 0 and q.max() <= 15
