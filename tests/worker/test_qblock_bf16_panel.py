"""The vdpbf16ps panel kernel (compute/kernels/qblock_bf16_panel.c) for BF16 rows: its
product is bf16(x) @ W.T summed in float32, against that product in float64, for row
counts that take one, several and a remainder of its 8-row passes, and output widths that
end in a partial panel; and its activations are torch's bfloat16 rounding of x."""

from __future__ import annotations

import pytest
import torch

from worker_svc.compute.qblock import BF16, quantize
from worker_svc.compute.qblock_bf16_panel import bf16_panel_matmul, load_bf16_panel_kernel

pytestmark = pytest.mark.skipif(load_bf16_panel_kernel() is None, reason="no AVX-512 BF16 here")


def case(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 7 * m + n)
    weight = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    return torch.randn(m, k, generator=g), weight


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """bf16(x) @ W.T in float64: both operands exactly as the kernel reads them."""
    return (x.to(torch.bfloat16).double() @ weight.double().T).float()


@pytest.mark.parametrize("m", [1, 7, 16, 64])
@pytest.mark.parametrize("n", [5, 16, 37])
@pytest.mark.parametrize("k", [32, 576])
def test_the_panel_is_bf16_x_times_w_in_float32_sums(m, n, k):
    x, weight = case(m, n, k)
    got = bf16_panel_matmul(x, quantize(weight, BF16))
    want = reference(x, weight)
    # Float32 sums of k products of about 0.05: a few ulps of the sum's magnitude.
    bound = 4 * k * torch.finfo(torch.float32).eps * (x.abs() @ weight.float().abs().T)
    assert got.shape == (m, n)
    assert bool(((got - want).abs() <= bound + 1e-30).all())


def test_it_rounds_the_activations_as_torch_does():
    """Against a float32 product of the unrounded x, the kernel is off by bfloat16's
    rounding; against torch's bfloat16 rounding of x, by float32 sums only."""
    x, weight = case(24, 48, 256, seed=3)
    got = bf16_panel_matmul(x, quantize(weight, BF16))
    exact_x = (x.double() @ weight.double().T).float()
    assert (got - exact_x).abs().max() > 1e-4  # the activations were rounded
    torch.testing.assert_close(got, reference(x, weight), rtol=1e-5, atol=1e-5)


def test_threads_share_panels_without_changing_a_bit():
    x, weight = case(40, 100, 512, seed=5)
    blocks = quantize(weight, BF16)
    assert torch.equal(bf16_panel_matmul(x, blocks, 1), bf16_panel_matmul(x, blocks, 2))


def test_a_k_not_a_multiple_of_32_is_refused():
    x, weight = case(2, 16, 48)
    with pytest.raises(RuntimeError, match="failed"):
        bf16_panel_matmul(x, weight.contiguous().view(torch.uint8))


def test_round_output_writes_bfloat16_as_torchs_gemm_does():
    """The native step's outputs: each float32 sum rounded to bfloat16, so they equal
    torch's bfloat16 GEMM's but where the two float32 sums straddle a rounding edge."""
    x, weight = case(64, 80, 512, seed=9)
    got = bf16_panel_matmul(x, quantize(weight, BF16), round_output=True)
    assert torch.equal(got, got.to(torch.bfloat16).float())  # bfloat16 values
    torch_gemm = torch.nn.functional.linear(x.to(torch.bfloat16), weight).float()
    assert (got == torch_gemm).float().mean() > 0.99
    torch.testing.assert_close(got, torch_gemm, rtol=8e-3, atol=1e-5)  # one bf16 step
