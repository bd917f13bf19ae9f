"""The Q4_1 x 8-bit-activation VNNI kernel (kernels/qblock_vnni8.c, vpdpbusd) against
numpy: its activation blocks bit for bit, its products exactly where every value is
exact in float32, and within float32 summation elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker_svc.compute.qblock import Q4_1, dequantize, quantize
from worker_svc.compute.qblock_vnni8 import (
    load_vnni8_kernel,
    quantize_rows_8bit,
    vnni8_matmul,
    vnni8_reads,
)

pytestmark = pytest.mark.skipif(load_vnni8_kernel() is None, reason="no AVX-512 VNNI here")


def numpy_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's Q8_1 in float32 as the kernel computes it: d = amax / 127, q =
    round-half-even(x * (127 / amax)), s = d * sum(q)."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).clip(-127, 127).astype(np.int32)
    s = (d * q.sum(-1).astype(np.float32)).astype(np.float32)
    return q.reshape(x.shape).astype(np.int8), d, s


def q4_1_blocks(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> torch.Tensor:
    """Q4_1 rows from nibbles q `[N, K]` (0..15), scales and minimums `[N, K / 32]`."""
    n, k = q.shape
    nib = q.reshape(n, k // 32, 32).astype(np.uint8)
    packed = nib[..., :16] | (nib[..., 16:] << 4)
    head = np.concatenate(
        [
            d.astype(np.float16)[..., None].view(np.uint8),
            m.astype(np.float16)[..., None].view(np.uint8),
        ],
        axis=-1,
    )
    return torch.from_numpy(np.concatenate([head, packed], -1).reshape(n, -1).copy())


def test_activation_blocks_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((13, 576)).astype(np.float32)
    x[:, 7] *= 60  # an outlier: only its block's scale grows
    x[2, 32:64] = 0  # an all-zero block: d = 0, q = 0
    qx, dx, sx = quantize_rows_8bit(torch.from_numpy(x))
    q, d, s = numpy_quantize(x)
    assert np.array_equal(qx.numpy(), q)
    assert np.array_equal(dx.numpy(), d)
    assert np.array_equal(sx.numpy(), s)


@pytest.mark.parametrize("m", [1, 8, 13, 64])
@pytest.mark.parametrize("n", [5, 16, 37])
def test_exact_where_every_value_is_exact(m, n):
    """Powers-of-two scales and integer activations: the kernel's float32 sums are exact,
    so its output is the integer arithmetic's to the bit. Odd N leaves a partial panel,
    odd M a tail of x rows past 8 at a time."""
    k = 576
    rng = np.random.default_rng(m * 100 + n)
    q = rng.integers(0, 16, (n, k))
    d = 2.0 ** -rng.integers(3, 6, (n, k // 32))
    mins = -(2.0 ** -rng.integers(2, 5, (n, k // 32)))
    blocks = q4_1_blocks(q, d, mins)
    ints = rng.integers(-127, 128, (m, k // 32, 32))
    ints[..., 0] = 127 * rng.choice([-1, 1], (m, k // 32))  # each block's max is 127
    dx = 2.0 ** -rng.integers(1, 4, (m, k // 32))
    x = (ints * dx[..., None]).reshape(m, k).astype(np.float32)
    dots = np.einsum("mbj,nbj->mnb", ints, q.reshape(n, k // 32, 32))
    sums = ints.sum(-1)  # [m, b]
    expected = (dots * d[None] * dx[:, None]).sum(-1) + (mins[None] * (dx * sums)[:, None]).sum(-1)
    got = vnni8_matmul(torch.from_numpy(x), blocks, k).numpy().astype(np.float64)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("m", [1, 13, 64])
@pytest.mark.parametrize("k", [64, 576, 1536])
def test_matches_numpy_on_random_weights(m, k):
    """Weights from quantize(), activations with an outlier channel: the kernel equals
    float64 on the dequantized weights and the numpy-quantized activations."""
    gen = torch.Generator().manual_seed(m + k)
    blocks = quantize(torch.randn(37, k, generator=gen) * 0.05, Q4_1)
    x = torch.randn(m, k, generator=gen)
    x[:, 7] *= 50
    q, d, _ = numpy_quantize(x.numpy())
    xq = q.reshape(m, -1, 32).astype(np.float64) * d[..., None].astype(np.float64)
    expected = xq.reshape(m, k) @ dequantize(blocks, Q4_1).double().numpy().T
    got = vnni8_matmul(x, blocks, k).double().numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_refuses_k_not_a_multiple_of_64():
    assert vnni8_reads(576) and not vnni8_reads(96)
    with pytest.raises(RuntimeError, match="-2"):
        vnni8_matmul(torch.randn(2, 96), quantize(torch.randn(16, 96), Q4_1), 96)


def test_projection_takes_it_only_with_act8_and_from_vnni_from_m():
    from worker_svc.compute.qblock import Q8_0, vnni_matmul
    from worker_svc.compute.qblock_linear import VNNI_FROM_M, QBlockLinear
    from worker_svc.compute.qblock_vnni8 import enable_act8

    gen = torch.Generator().manual_seed(3)
    layer = QBlockLinear(
        quantize(torch.randn(48, 128, generator=gen), Q4_1), Q4_1, 128, vnni_from_m=VNNI_FROM_M
    )
    x = torch.randn(VNNI_FROM_M, 128, generator=gen)
    assert torch.equal(layer(x), vnni_matmul(x, layer.blocks, Q4_1, 128))
    assert enable_act8(layer)
    assert torch.equal(layer(x), vnni8_matmul(x, layer.blocks, 128))
    small = x[: VNNI_FROM_M - 1]  # below the threshold: float activations, as before
    torch.testing.assert_close(small @ layer.dequantized().T, layer(small), rtol=1e-5, atol=1e-4)
    head = QBlockLinear(quantize(torch.randn(16, 128), Q8_0), Q8_0, 128, vnni_from_m=VNNI_FROM_M)
    odd = QBlockLinear(quantize(torch.randn(16, 96), Q4_1), Q4_1, 96, vnni_from_m=VNNI_FROM_M)
    assert not enable_act8(head) and not enable_act8(odd)
