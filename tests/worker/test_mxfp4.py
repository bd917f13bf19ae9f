"""gpt-oss's MXFP4 blocks (GGUF type 39) read as stored by the block kernels
(compute/kernels/qblock_mxfp4.c, and qblock_vnni.c's panels), on every variant this CPU
runs: weights bit for bit a numpy dequantization (and the `gguf` package's, llama.cpp's
rule), products within float32 summation of the exact products, the VNNI kernel within
its 16-bit activation rounding."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from worker_svc.compute.qblock import (
    FORMATS,
    MXFP4,
    dequantize,
    load_vnni_kernel,
    qblock_matmul,
    quantize,
    supported_variants,
    vnni_matmul,
)
from worker_svc.compute.qblock_linear import QBlockLinear

CODES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
# E8M0 bytes giving 2^-30 .. 2^20 (the scale is 2^(e - 128)).
SMALLEST, LARGEST = 128 - 30, 128 + 20
VNNI = load_vnni_kernel() is not None
# The float kernel's variants, then the VNNI kernel's where the CPU has it.
KERNELS = [*supported_variants(), *(["vnni"] if VNNI else [])]


def reference(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 rows `[N, K / 32 * 17]` -> float32 `[N, K]`: code * 2^(e - 128)."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, 17)
    scale = np.ldexp(np.float32(1), b[..., 0].astype(np.int32) - 128).astype(np.float32)
    codes = np.concatenate([CODES[b[..., 1:] & 0x0F], CODES[b[..., 1:] >> 4]], axis=-1)
    with np.errstate(over="ignore"):  # 2^127 times 4 or more is inf, as in llama.cpp
        return (codes * scale[..., None]).reshape(n, -1)


def mxfp4_rows(n: int, k: int, seed: int, exponents=(SMALLEST, LARGEST + 1)) -> torch.Tensor:
    """Random codes, random exponents with both extremes present, and some zero blocks
    (every code +0 or -0)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(*exponents, size=(n, k // 32))
    blocks[0, 0, 0], blocks[-1, -1, 0] = exponents[0], exponents[1] - 1
    zero = rng.random((n, k // 32)) < 0.1
    blocks[zero, 1:] = rng.choice(np.array([0x00, 0x08, 0x80, 0x88], np.uint8), (zero.sum(), 16))
    return torch.from_numpy(blocks.reshape(n, -1))


def product(x: torch.Tensor, blocks: torch.Tensor, k: int, kernel: str) -> torch.Tensor:
    if kernel == "vnni":
        return vnni_matmul(x, blocks, MXFP4, k)
    return qblock_matmul(x, blocks, MXFP4, k, kernel)


def test_the_format_is_17_bytes_per_32_weights_read_from_files_only():
    assert FORMATS["MXFP4"] is MXFP4 and MXFP4.row_bytes(2880) == 90 * 17 and MXFP4.vnni
    with pytest.raises(ValueError, match="from files"):
        quantize(torch.randn(4, 64), MXFP4)


@pytest.mark.parametrize("variant", supported_variants())
def test_every_exponent_and_code_dequantizes_bit_for_bit(variant):
    """All 256 E8M0 bytes (subnormal scales 2^-128 and 2^-127 included, 2^127 too)."""
    blocks = mxfp4_rows(16, 512, seed=1, exponents=(0, 256))
    want = reference(blocks.numpy())
    kind = gguf.GGMLQuantizationType.MXFP4
    with np.errstate(over="ignore"):
        theirs = gguf.quants.dequantize(blocks.numpy(), kind).reshape(want.shape)
    assert np.isinf(want).any() and np.array_equal(theirs, want)
    assert np.array_equal(dequantize(blocks, MXFP4, variant, threads=2).numpy(), want)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_products_match_the_exact_weights(kernel, m):
    """N = 37: a partial tile and a partial 16-row VNNI panel. The float kernel's error is
    bounded by float32 summation of the exact products (each weight and each product is
    exact): |err| <= 2 K 2^-24 sum |w x|. The VNNI kernel's 16-bit activation blocks:
    each x off by at most half its block's step (max / 32767), then float32 scaling."""
    n, k = 37, 256
    blocks = mxfp4_rows(n, k, seed=m)
    weight = torch.from_numpy(reference(blocks.numpy())).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    want = x.double() @ weight.T
    got = product(x, blocks, k, kernel).double()
    magnitude = x.double().abs() @ weight.abs().T
    if kernel == "vnni":
        # Each x rounded to a step of its block's max / 32767: at most half a step each.
        steps = x.double().abs().reshape(m, k // 32, 32).amax(-1).repeat_interleave(32, -1)
        rounding = (steps / 32767 / 2) @ weight.abs().T
        assert ((got - want).abs() <= rounding + 1e-5 * magnitude).all()
        assert ((got - want).norm() / want.norm()).item() < 1e-4
    else:
        assert ((got - want).abs() <= 2 * k * 2.0**-24 * magnitude).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_one_hot_rows_read_each_blocks_own_scale(kernel, m):
    """A one-hot row reads single weights: each exactly (float kernel), or within 16-bit
    activation rounding (VNNI) whatever its block's scale, 2^-30 to 2^20."""
    n, k = 21, 128
    blocks = mxfp4_rows(n, k, seed=100 + m)
    weight = torch.from_numpy(reference(blocks.numpy()))
    columns = torch.randperm(k, generator=torch.Generator().manual_seed(m))[:m]
    x = torch.zeros(m, k)
    x[torch.arange(m), columns] = 1.0
    got, want = product(x, blocks, k, kernel), weight[:, columns].T
    if kernel == "vnni":
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)
    else:
        assert torch.equal(got, want)


def test_qblock_linear_takes_the_vnni_kernel_from_its_threshold():
    k = 256
    blocks = mxfp4_rows(40, k, seed=5)
    layer = QBlockLinear(blocks, MXFP4, k, dense_from_m=None, vnni_from_m=16)
    assert layer.vnni == VNNI
    weight = torch.from_numpy(reference(blocks.numpy())).double()
    for m in (1, 20):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        want = x.double() @ weight.T
        assert ((layer(x).double() - want).norm() / want.norm()).item() < 1e-4
    assert torch.equal(layer.dequantized(), weight.float())


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError):
        QBlockLinear(mxfp4_rows(4, 64, seed=0)[:, :20], MXFP4, 40)
