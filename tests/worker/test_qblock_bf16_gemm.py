"""BF16 rows on torch's bfloat16 GEMM (compute/qblock_linear.py bf16_matmul): the same
product as torch's own bfloat16 matmul on the same weights, taken from the measured row
count only, and only on a CPU with bf16 dot products (flags passed explicitly, so the
rule is tested whatever CPU runs the suite)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_svc.compute.measured import MEASURED, QBlockStrategy, has_bf16_dot_products
from worker_svc.compute.qblock import BF16, F16, Q8_0, dense_matmul, qblock_matmul, quantize
from worker_svc.compute.qblock_linear import (
    BF16_GEMM_ENV,
    QBlockLinear,
    bf16_gemm_threshold,
    bf16_matmul,
)

ZEN4 = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"})
SAPPHIRE_RAPIDS = frozenset({"avx2", "fma", "avx512f", "amx_tile", "amx_bf16", "amx_int8"})
ICE_LAKE = ZEN4 - {"avx512_bf16"}  # AVX-512 and VNNI, bfloat16 emulated by torch
ZEN3 = frozenset({"avx2", "fma"})
N, K = 96, 256


def bf16_weight(seed: int = 0) -> torch.Tensor:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05
    return w.to(torch.bfloat16)


def rows(m: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, K, generator=torch.Generator().manual_seed(seed + m))


def test_bf16_rows_are_plain_bfloat16_viewed_without_a_copy():
    weight = bf16_weight()
    blocks = quantize(weight, BF16)
    view = blocks.view(torch.bfloat16)
    assert view.shape == (N, K) and view.data_ptr() == blocks.data_ptr()
    assert torch.equal(view, weight)  # no header, no scale: the values themselves


@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_it_is_torchs_bfloat16_matmul_on_the_same_weights(m):
    weight, x = bf16_weight(), rows(m)
    got = bf16_matmul(x, quantize(weight, BF16))
    assert got.dtype == torch.float32 and got.shape == (m, N)
    assert torch.equal(got, F.linear(x.to(torch.bfloat16), weight).float())
    # Within bfloat16 rounding of the exact product of the rounded activations.
    exact = x.to(torch.bfloat16).double() @ weight.double().T
    torch.testing.assert_close(got.double(), exact, rtol=2**-7, atol=2**-7 * exact.abs().max())


def test_the_threshold_is_honoured_per_m_with_the_bias():
    weight = bf16_weight()
    blocks, bias = quantize(weight, BF16), torch.randn(N)
    layer = QBlockLinear(blocks, BF16, K, bias=bias, bf16_gemm_from_m=8, flags=ZEN4)
    assert layer.bf16_gemm_from_m == 8
    for m in (1, 7):  # the float block kernel: float32 products of the bf16 weights
        want = qblock_matmul(rows(m), blocks, BF16, K) + bias
        assert torch.equal(layer(rows(m)), want)
    for m in (8, 33):
        want = F.linear(rows(m).to(torch.bfloat16), weight).float() + bias
        assert torch.equal(layer(rows(m)), want)


@pytest.mark.parametrize("flags", [ICE_LAKE, ZEN3, frozenset()], ids=["icelake", "zen3", "none"])
def test_a_cpu_without_bf16_dot_products_never_takes_it(flags):
    blocks = quantize(bf16_weight(), BF16)
    assert not has_bf16_dot_products(flags)
    layer = QBlockLinear(blocks, BF16, K, dense_from_m=None, bf16_gemm_from_m=2, flags=flags)
    assert layer.bf16_gemm_from_m is None
    assert torch.equal(layer(rows(64)), qblock_matmul(rows(64), blocks, BF16, K))
    dense = QBlockLinear(blocks, BF16, K, dense_from_m=16, bf16_gemm_from_m=2, flags=flags)
    assert torch.equal(dense(rows(64)), dense_matmul(rows(64), blocks, BF16, K))


def test_amx_or_avx512_bf16_and_bf16_rows_only():
    assert bf16_gemm_threshold(BF16, 16, ZEN4) == 16
    assert bf16_gemm_threshold(BF16, 16, SAPPHIRE_RAPIDS) == 16
    assert bf16_gemm_threshold(BF16, None, ZEN4) is None  # not measured: never
    for fmt in (F16, Q8_0):  # other formats keep their own kernels
        assert bf16_gemm_threshold(fmt, 16, ZEN4) is None


def test_the_environment_overrides_the_measured_threshold(monkeypatch):
    monkeypatch.setenv(BF16_GEMM_ENV, "4")
    assert bf16_gemm_threshold(BF16, flags=ZEN4) == 4
    assert bf16_gemm_threshold(BF16, flags=ICE_LAKE) is None  # still never without them
    monkeypatch.setenv(BF16_GEMM_ENV, "off")
    assert bf16_gemm_threshold(BF16, flags=ZEN4) is None


def test_only_measured_classes_with_bf16_dot_products_set_it():
    with pytest.raises(ValueError):
        QBlockStrategy(bf16_gemm_from_m=1)
    taking = [cpu for cpu in MEASURED if cpu.qblock.bf16_gemm_from_m is not None]
    assert taking, "no CPU class takes the bf16 GEMM"
    assert all(has_bf16_dot_products(cpu.flags) for cpu in taking)
