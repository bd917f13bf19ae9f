"""bench.roofline.achieved: which kernel, and so which peak, a projection is held to."""

from __future__ import annotations

import torch

from bench.roofline.achieved import fma_here, qblock_kernel_at, torch_kernel
from worker_svc.compute.qblock import Q4_1
from worker_svc.compute.qblock_linear import QBlockLinear

ZEN4 = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"})
ZEN3 = frozenset({"avx2", "fma"})


def test_the_float_kernels_are_held_to_the_widest_fma_the_cpu_has():
    assert fma_here(ZEN4) == "fma-zmm"
    assert fma_here(ZEN3) == "fma-ymm"
    assert fma_here(frozenset({"sse4_2"})) is None


def test_torch_bfloat16_is_held_to_vdpbf16ps_only_where_the_cpu_has_it():
    assert torch_kernel(torch.bfloat16, ZEN4) == ("torch bf16 GEMM", "vdpbf16ps")
    assert torch_kernel(torch.bfloat16, ZEN3)[1] == "fma-ymm"
    assert torch_kernel(torch.float32, ZEN4) == ("torch float32 GEMM", "fma-zmm")


def test_a_block_projection_takes_the_kernel_its_thresholds_give_at_each_m():
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    layer = QBlockLinear.from_float(weight, Q4_1, vnni_from_m=16, dense_from_m=48)
    assert qblock_kernel_at(layer, 1, ZEN4) == ("float block kernel", "fma-zmm")
    if layer.vnni:  # this CPU has AVX-512 VNNI and the kernel built
        assert qblock_kernel_at(layer, 16, ZEN4) == ("VNNI kernel", "vpdpwssd")
        assert qblock_kernel_at(layer, 64, ZEN4) == ("VNNI kernel", "vpdpwssd")
    else:
        assert qblock_kernel_at(layer, 16, ZEN3) == ("float block kernel", "fma-ymm")
        assert qblock_kernel_at(layer, 64, ZEN3) == ("dequant + torch f32 GEMM", "fma-ymm")
    plain = QBlockLinear.from_float(weight, Q4_1, vnni_from_m=None, dense_from_m=None)
    assert qblock_kernel_at(plain, 256, ZEN4) == ("float block kernel", "fma-zmm")


def test_bf16_rows_past_their_gemm_threshold_are_held_to_vdpbf16ps():
    from worker_svc.compute.qblock import BF16

    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    rows = QBlockLinear.from_float(weight, BF16, bf16_gemm_from_m=32, flags=ZEN4)
    assert qblock_kernel_at(rows, 64, ZEN4) == ("BF16 rows, torch bf16 GEMM", "vdpbf16ps")
    assert qblock_kernel_at(rows, 16, ZEN4)[0] != "BF16 rows, torch bf16 GEMM"
    never = QBlockLinear.from_float(weight, BF16, bf16_gemm_from_m=32, flags=ZEN3)
    assert qblock_kernel_at(never, 64, ZEN3)[0] != "BF16 rows, torch bf16 GEMM"
