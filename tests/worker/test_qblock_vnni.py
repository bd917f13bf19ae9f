"""The large-M block kernel on AVX-512 VNNI (16-bit activation blocks, integer dot
products) against float64 on the dequantized weights, and when QBlockLinear takes it."""

from __future__ import annotations

import pytest
import torch

from tests.worker.kquant_file import random_blocks
from worker_svc.compute import qblock_linear
from worker_svc.compute.measured import QBlockStrategy, closest_measured
from worker_svc.compute.qblock import (
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_K,
    Q6_K,
    Q8_0,
    dequantize,
    load_vnni_kernel,
    quantize,
    vnni_matmul,
)
from worker_svc.compute.qblock_linear import VNNI_FROM_M, QBlockLinear

ICE_LAKE = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"})

pytestmark = pytest.mark.skipif(load_vnni_kernel() is None, reason="no AVX-512 VNNI here")


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0], ids=lambda f: f.name)
@pytest.mark.parametrize("m", [1, 8, 13, 64])
@pytest.mark.parametrize("n", [5, 16, 37])
def test_matches_float_reference_within_16_bit_rounding(fmt, m, n):
    """Odd N leaves a partial 16-row panel, odd M a tail of x rows past 8 at a time."""
    gen = torch.Generator().manual_seed(m * 100 + n)
    blocks = quantize(torch.randn(n, 128, generator=gen) * 0.05, fmt)
    x = torch.randn(m, 128, generator=gen)
    x[:, 7] *= 50  # an outlier channel: its block's scale grows, the others' do not
    expected = x.double() @ dequantize(blocks, fmt).double().T
    got = vnni_matmul(x, blocks, fmt, 128).double()
    assert ((got - expected).norm() / expected.norm()).item() < 1e-4


@pytest.mark.parametrize("fmt", [Q4_K, Q5_K, Q6_K, Q5_0], ids=lambda f: f.name)
@pytest.mark.parametrize("m", [1, 13, 64])
@pytest.mark.parametrize("n", [5, 37])
def test_k_quants_match_float_reference_within_16_bit_rounding(fmt, m, n):
    """Blocks of every field value (random bytes, finite scales): Q6_K's blocks of 16
    weights, Q4_K / Q5_K's minimums, Q5_0's signed 5 bits. Same bound as Q4_1's
    (measured ~5e-5 on Zen 4 for both)."""
    gen = torch.Generator().manual_seed(m * 100 + n)
    blocks = random_blocks(fmt, n, 512, seed=m + n)
    x = torch.randn(m, 512, generator=gen)
    x[:, 7] *= 50
    expected = x.double() @ dequantize(blocks, fmt).double().T
    got = vnni_matmul(x, blocks, fmt, 512).double()
    assert ((got - expected).norm() / expected.norm()).item() < 1e-4


def test_zero_rows_and_blocks():
    blocks = quantize(torch.randn(16, 64), Q4_1)
    x = torch.zeros(3, 64)
    x[1, 40:] = 1.0
    got = vnni_matmul(x, blocks, Q4_1, 64)
    assert torch.equal(got[0], torch.zeros(16))
    torch.testing.assert_close(
        got[1], dequantize(blocks, Q4_1)[:, 40:].sum(1), rtol=1e-4, atol=1e-4
    )


def test_projection_takes_it_from_vnni_from_m(monkeypatch):
    layer = QBlockLinear(quantize(torch.randn(32, 64), Q4_1), Q4_1, 64, vnni_from_m=VNNI_FROM_M)
    head = QBlockLinear(
        quantize(torch.randn(32, 64), Q8_0), Q8_0, 64, dense_from_m=None, vnni_from_m=VNNI_FROM_M
    )
    assert layer.vnni and head.vnni
    calls = []
    monkeypatch.setattr(qblock_linear, "vnni_matmul", lambda *a: calls.append(a) or a[0][:, :32])
    layer(torch.randn(VNNI_FROM_M - 1, 64))
    assert not calls
    layer(torch.randn(VNNI_FROM_M, 64))
    assert len(calls) == 1
    monkeypatch.setenv("CBSERVE_QBLOCK_VNNI", "0")
    assert not QBlockLinear(quantize(torch.randn(32, 64), Q4_1), Q4_1, 64).vnni


def test_this_cpus_measured_thresholds_are_the_default():
    """A projection built without thresholds takes its CPU class's (compute/measured.py):
    on an Ice Lake class Xeon the float kernel up to 255 rows, on Zen 4 VNNI from 16."""
    layer = QBlockLinear(quantize(torch.randn(32, 64), Q4_1), Q4_1, 64)
    here = qblock_linear.strategy_here()
    assert (layer.vnni_from_m, layer.dense_from_m) == (here.vnni_from_m, here.dense_from_m)
    assert closest_measured(ICE_LAKE).qblock == QBlockStrategy(vnni_from_m=256, dense_from_m=None)
    zen4 = QBlockStrategy(bf16_gemm_from_m=32)  # BF16 rows: torch's bf16 GEMM from 32
    assert closest_measured(ICE_LAKE | {"avx512_bf16"}).qblock == zen4


@pytest.mark.parametrize("k", [32, 256, 1536])
def test_a_panel_is_transposed_word_by_word(k):
    """qblock_vnni_transpose_panel: vector k2 holds every row's int16 pair at 2 * k2, the
    layout the panel's vpdpwssd reads (the 16 x 16 register transpose's shuffles each
    move a different lane: a wrong immediate shows here as a misplaced pair)."""
    import ctypes

    gen = torch.Generator().manual_seed(k)
    rows = torch.randint(-32768, 32767, (16, k), generator=gen, dtype=torch.int16)
    packed = torch.empty(k // 2, 16, 2, dtype=torch.int16)
    load_vnni_kernel().qblock_vnni_transpose_panel(
        ctypes.c_void_p(rows.data_ptr()), ctypes.c_int64(k), ctypes.c_void_p(packed.data_ptr())
    )
    assert torch.equal(packed, rows.view(16, k // 2, 2).permute(1, 0, 2))
