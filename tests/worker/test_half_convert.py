"""half_convert.h, the float16 KV pool's conversions, against torch's own, with F16C
(what -march=native picks on x86-64) and with the portable bit-level path."""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import pytest
import torch

from worker_svc.attention.cpu_kernel import SOURCE as PAGED_DECODE_SOURCE
from worker_svc.native_build import KernelUnavailableError, build_and_load

PROBE = Path(__file__).with_name("kernels") / "half_convert_probe.c"
HEADER = PAGED_DECODE_SOURCE.with_name("half_convert.h")
BASE_FLAGS = ("-O2", "-march=native", "-fPIC", "-std=c11", f"-I{HEADER.parent}")
BUILDS = {"native": (), "portable": ("-mno-f16c",)}


def probe(build: str) -> ctypes.CDLL:
    # The header's hash in the flags: the build cache keys on the flags, not on
    # headers outside the probe's own folder.
    digest = hashlib.sha256(HEADER.read_bytes()).hexdigest()[:16]
    flags = BASE_FLAGS + BUILDS[build] + (f"-DHALF_CONVERT_HASH={digest}",)
    try:
        lib = build_and_load(PROBE, flags, ("-shared", "-lm"))
    except KernelUnavailableError as exc:
        pytest.fail(f"the probe did not build: {exc}")
    for name in ("probe_float_to_half", "probe_half_to_float"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def edge_values() -> torch.Tensor:
    """Every class a KV value can fall in: zeros, subnormals, ties between two halves,
    the overflow edge, infinities and nan, and ordinary numbers of both signs."""
    special = [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.99, 65520.0, 1e6, float("inf")]
    special += [float("-inf"), 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-14, 2.0**-15]
    special += [1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 6.1e-5, -3.0e-7, 1e-30]
    gen = torch.Generator().manual_seed(0)
    ordinary = torch.randn(4096, generator=gen) * torch.logspace(-8, 4, 4096)
    # Every float16 bit pattern that is a number, as float32: the widening is exact.
    every_half = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    every_half = every_half[~torch.isnan(every_half)].float()
    return torch.cat([torch.tensor(special), ordinary, every_half])


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_float_to_half_rounds_as_torch_does(build):
    values = edge_values()
    out = torch.empty(values.shape, dtype=torch.int16)
    probe(build).probe_float_to_half(values.data_ptr(), out.data_ptr(), values.numel())
    want = values.half().view(torch.int16)
    assert torch.equal(out, want), (values[out != want][:8], out[out != want][:8])


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_half_to_float_is_exact_for_every_half(build):
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    out = torch.empty(halves.shape, dtype=torch.float32)
    probe(build).probe_half_to_float(halves.data_ptr(), out.data_ptr(), halves.numel())
    want = halves.view(torch.float16).float()
    numbers = ~torch.isnan(want)
    assert torch.equal(out[numbers].view(torch.int32), want[numbers].view(torch.int32))
    assert torch.isnan(out[~numbers]).all()


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_nan_stays_nan(build):
    values = torch.tensor([float("nan"), -float("nan")])
    out = torch.empty(2, dtype=torch.int16)
    probe(build).probe_float_to_half(values.data_ptr(), out.data_ptr(), 2)
    assert torch.isnan(out.view(torch.float16)).all()
