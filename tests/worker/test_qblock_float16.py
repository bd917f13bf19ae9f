"""The block kernel on F16 and BF16 rows (compute/kernels/qblock_float16.c), every variant
this CPU runs: weights bit for bit gguf-py's own dequantizer's (every finite bit
pattern, subnormals included), products against float64 on those weights, and the
blocks `quantize` writes equal to gguf-py's own writer's."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from bench.micro.qblock_formats import random_blocks
from worker_svc.compute.qblock import (
    BF16,
    F16,
    dense_matmul,
    dequantize,
    qblock_matmul,
    quantize,
    supported_variants,
)
from worker_svc.compute.qblock_linear import QBlockLinear

QTYPE = gguf.GGMLQuantizationType
VARIANTS = supported_variants()
FORMATS = [F16, BF16]
# The exponent bits: all ones is an infinity or a NaN, which no weight file holds.
EXPONENT = {"F16": 0x7C00, "BF16": 0x7F80}


def by_name(fmt) -> str:
    return fmt.name


def gguf_weights(blocks: torch.Tensor, fmt) -> np.ndarray:
    values = gguf.quants.dequantize(blocks.numpy(), QTYPE[fmt.name])
    return np.asarray(values, dtype=np.float32).reshape(blocks.shape[0], -1)


def every_bit_pattern(fmt, k: int = 1024) -> torch.Tensor:
    """All 65536 16-bit patterns but the infinities and NaNs, as rows of K weights."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    bits = bits[(bits & EXPONENT[fmt.name]) != EXPONENT[fmt.name]]
    bits = np.resize(bits, (len(bits) + k - 1) // k * k)
    return torch.from_numpy(bits.view(np.uint8).reshape(-1, 2 * k).copy())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_every_weight_widens_as_ggufs_dequantizer_does(variant, fmt):
    blocks = every_bit_pattern(fmt)
    got = dequantize(blocks, fmt, variant, threads=2).numpy()
    assert np.array_equal(got.view(np.uint32), gguf_weights(blocks, fmt).view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_quantize_writes_what_ggufs_writer_writes(fmt):
    """Round to nearest even, as gguf-py's converter rounds a float32 checkpoint."""
    w = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    w[0, :4] = [1e-40, -3e-39, 65504.0, 1 + 2**-8]  # subnormals, F16's largest, a tie
    want = np.asarray(gguf.quants.quantize(w, QTYPE[fmt.name])).view(np.uint8).reshape(16, -1)
    assert np.array_equal(quantize(torch.from_numpy(w), fmt).numpy(), want)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 17, 70])
@pytest.mark.parametrize("n", [1, 7, 36])
def test_products_match_float64(variant, fmt, m, n):
    """Odd M and N reach the tails: partial register tiles (rows < 4), M past the
    in-register path (> 4) and past a chunk of x (64 rows). Float32 sums in another
    order than float64's: 2e-5 of the largest output, far below one wrong weight."""
    k = 512
    blocks = random_blocks(fmt, n, k, seed=m * 100 + n)
    weight = torch.from_numpy(gguf_weights(blocks, fmt))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n))
    got = qblock_matmul(x, blocks, fmt, k, variant)
    want = (x.double() @ weight.double().T).float()
    scale = float(want.abs().max()) + 1e-30
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5 * scale)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
@pytest.mark.parametrize("m", [1, 4, 96])
def test_one_hot_rows_read_the_exact_weights(variant, fmt, m):
    """A one-hot row of x reads single weights: in registers (M <= 4) and through the
    panel buffer (M = 96) each equals gguf's widened weight exactly (no bf16 rounding of
    the activations: 1.0 would survive it, so x's ones are scaled by 1 + 2**-20)."""
    k = 256
    blocks = random_blocks(fmt, 9, k, seed=7)
    weight = torch.from_numpy(gguf_weights(blocks, fmt))
    columns = torch.randperm(k, generator=torch.Generator().manual_seed(m))[:m]
    x = torch.zeros(m, k)
    x[torch.arange(m), columns] = 1.0 + 2**-20
    got = qblock_matmul(x, blocks, fmt, k, variant)
    assert torch.equal(got, weight[:, columns].T * (1.0 + 2**-20))


@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_qblock_linear_takes_them_without_vnni(fmt):
    k = 512
    blocks = random_blocks(fmt, 40, k, seed=3)
    # The float kernels here; BF16's bf16 GEMM: tests/worker/test_qblock_bf16_gemm.py.
    layer = QBlockLinear(blocks, fmt, k, dense_from_m=64, vnni_from_m=16, bf16_gemm_from_m=None)
    assert not layer.vnni  # the VNNI kernel reads Q4_1 / Q8_0 only
    weight = layer.dequantized().double()
    for m in (1, 20, 64):  # block kernel in registers, through the buffer, dense chunks
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        want = (x.double() @ weight.T).float()
        scale = float(want.abs().max())
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=2e-5 * scale)
    torch.testing.assert_close(dense_matmul(x, blocks, fmt, k), want, rtol=1e-5, atol=2e-5 * scale)
