"""The block kernel on Q4_K, Q5_K, Q6_K and Q5_0 blocks (compute/kernels/qblock_kquants*.c),
every variant this CPU runs: weights bit for bit gguf-py's own dequantizer's, products
against float64 on those weights. Blocks are random bytes with finite f16 scales: any
byte is valid in the other fields (gguf-py writes none of the K-quants)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.worker.kquant_file import QTYPE, quantize_q4_k, quantize_q6_k, random_blocks
from worker_svc.compute.qblock import (
    Q4_K,
    Q5_0,
    Q5_K,
    Q6_K,
    dense_matmul,
    dequantize,
    load_vnni_kernel,
    qblock_matmul,
    quantize,
    supported_variants,
)
from worker_svc.compute.qblock_linear import QBlockLinear

VARIANTS = supported_variants()
FORMATS = [Q4_K, Q5_K, Q6_K, Q5_0]


def by_name(fmt) -> str:
    return fmt.name


def gguf_weights(blocks: torch.Tensor, fmt) -> np.ndarray:
    values = gguf.quants.dequantize(blocks.numpy(), QTYPE[fmt.name])
    return values.reshape(blocks.shape[0], -1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_dequantized_weights_are_ggufs_bit_for_bit(variant, fmt):
    blocks = random_blocks(fmt, 37, 768, seed=fmt.code)
    got = dequantize(blocks, fmt, variant, threads=2).numpy()
    assert np.array_equal(got, gguf_weights(blocks, fmt))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 70])
@pytest.mark.parametrize("n", [1, 7, 36])
def test_products_match_float64(variant, fmt, m, n):
    """Odd M and N reach the tails: partial register tiles (rows < 4), the in-register
    path's two tile shapes (M <= 4, 5-8), M past it (> 8) and past a chunk of x (64
    rows). Error measured: at most 6.6e-7 of the outputs' largest magnitude on Zen 4
    (K = 512, float32 sums in another order); 2e-5 leaves room for other CPUs and stays
    far below one wrong weight."""
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
@pytest.mark.parametrize("m", [1, 4, 7, 96])
def test_one_hot_rows_read_the_exact_weights(variant, fmt, m):
    """A one-hot row of x reads single weights: in registers (M <= 8) and through the
    panel buffer (M = 96) each equals gguf's dequantized weight exactly."""
    k = 256
    blocks = random_blocks(fmt, 9, k, seed=7)
    weight = torch.from_numpy(gguf_weights(blocks, fmt))
    columns = torch.randperm(k, generator=torch.Generator().manual_seed(m))[:m]
    x = torch.zeros(m, k)
    x[torch.arange(m), columns] = 1.0
    assert torch.equal(qblock_matmul(x, blocks, fmt, k, variant), weight[:, columns].T)


@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_qblock_linear_takes_them_on_every_path(fmt):
    """The block kernel in registers (M <= 4), through the panel buffer, the VNNI kernel
    (16-bit activation blocks, where the CPU has it: compute/kernels/
    qblock_kquants_vnni.c) and the dense chunks, each against float64."""
    k = 512
    blocks = random_blocks(fmt, 40, k, seed=3)
    float_only = QBlockLinear(blocks, fmt, k, dense_from_m=64, vnni_from_m=None)
    layer = QBlockLinear(blocks, fmt, k, dense_from_m=None, vnni_from_m=16)
    assert layer.vnni == (load_vnni_kernel() is not None)
    weight = layer.dequantized().double()
    for m in (1, 20, 64):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        want = (x.double() @ weight.T).float()
        scale = float(want.abs().max())
        torch.testing.assert_close(float_only(x), want, rtol=1e-5, atol=2e-5 * scale)
        # 16-bit activations: errors of ~1e-5 of the outputs' scale (Q4_1's too).
        torch.testing.assert_close(layer(x), want, rtol=1e-4, atol=2e-4 * scale)
    torch.testing.assert_close(dense_matmul(x, blocks, fmt, k), want, rtol=1e-5, atol=2e-5 * scale)


def test_rows_that_are_not_whole_super_blocks_are_refused():
    blocks = random_blocks(Q4_K, 4, 512)
    with pytest.raises(ValueError):
        QBlockLinear(blocks[:, :144], Q4_K, 288)
    with pytest.raises(ValueError):
        quantize(torch.randn(4, 512), Q4_K)  # read from files only


@pytest.mark.parametrize(("writer", "qtype"), [(quantize_q4_k, "Q4_K"), (quantize_q6_k, "Q6_K")])
def test_the_test_writers_make_what_gguf_reads(writer, qtype):
    """The numpy writers used for the mixed-format file: gguf-py reads their blocks back
    within a quantization step of the weights."""
    w = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32) * 0.05
    back = gguf.quants.dequantize(writer(w), QTYPE[qtype]).reshape(w.shape)
    step = np.abs(w).max() * 2 / (15 if qtype == "Q4_K" else 63)
    assert np.abs(back - w).max() <= step
