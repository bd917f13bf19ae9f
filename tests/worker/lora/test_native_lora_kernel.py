"""The native step's LoRA arithmetic alone (kernels/decode_lora.c) against torch: the
shrink of chunks of A rows and the expand of ranges of output columns, for scattered
rows of a group, ranks that are and are not a multiple of 16, and ranges that end
inside a vector; built as the step builds it and without AVX-512 (the expand of CPUs
that lack it, which this one would not otherwise run)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from worker_svc.models.qblock.native import KERNELS, LORA_FLAGS
from worker_svc.native_build import KernelUnavailableError, build_and_load

BUILDS = {"as-built": LORA_FLAGS, "no-avx512": (*LORA_FLAGS, "-mno-avx512f")}
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _load(flags):
    try:
        lib = build_and_load(KERNELS / "decode_lora.c", flags, ("-shared", "-fopenmp"))
    except KernelUnavailableError as exc:
        pytest.skip(str(exc))
    lib.lora_shrink.argtypes = [_P, _I, _I, _P, _I, _P, _I, _P, _I]
    lib.lora_expand.argtypes = [_P, _I, _I, _I, _P, _I, _P, _I, _P, _I]
    return lib


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(("rank", "n"), [(16, 32), (8, 37), (32, 13), (16, 100)])
def test_shrink_then_expand_equal_torch(build, rank, n):
    lib = _load(BUILDS[build])
    gen = torch.Generator().manual_seed(rank * 1000 + n)
    T, k, width, ldy = 9, 96, 3 * rank, n + 7
    rows = torch.tensor([7, 1, 4, 2, 8], dtype=torch.int64)  # a group, out of order
    x = torch.randn(T, k, generator=gen)
    a = torch.randn(rank, k, generator=gen)
    b = torch.randn(rank, n + 5, generator=gen)  # ldb wider than the range
    shrunk = torch.full((T, width), float("nan"))
    lib.lora_shrink(
        a.data_ptr(), rank, k, x.data_ptr(), k, rows.data_ptr(), 5, shrunk.data_ptr(), width
    )
    torch.testing.assert_close(shrunk[rows, :rank], x[rows] @ a.T, rtol=1e-5, atol=1e-4)
    assert shrunk[:, rank:].isnan().all(), "wrote past its chunk of A rows"
    y = torch.randn(T, ldy, generator=gen)
    want = y.clone()
    want[rows, :n] += shrunk[rows, :rank] @ b[:, :n]
    lib.lora_expand(
        b.data_ptr(), n + 5, n, rank, shrunk.data_ptr(), width, rows.data_ptr(), 5,
        y.data_ptr(), ldy,
    )  # fmt: skip
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)  # other rows, columns unchanged
