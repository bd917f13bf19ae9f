"""`--dtype auto` and forced paths, with made-up CPU flag sets (no machine read)."""

from __future__ import annotations

import pytest

from worker_svc import native_build
from worker_svc.compute import measured
from worker_svc.compute.measured import MeasuredCpu
from worker_svc.compute.paths import PATHS
from worker_svc.compute.selection import ComputePathUnavailableError, select_path
from worker_svc.config import DTYPES

ZEN3 = frozenset({"sse4_2", "avx", "avx2", "fma"})
ZEN5 = ZEN3 | {"avx512f", "avx512_bf16", "avx512_vnni"}
SAPPHIRE_RAPIDS = ZEN5 | {"amx_bf16", "amx_int8", "amx_tile", "avx512_fp16"}
OLD_CPU = frozenset({"sse4_2"})


@pytest.fixture
def table(monkeypatch):
    """Replace the measured table: a Zen 3 class where int8 wins and an AMX class where
    bfloat16 wins; the Zen 5 flags are measured nowhere more specific than Zen 3."""
    rows = (
        MeasuredCpu("avx2 box", ZEN3, {"float32": (10.0, 20.0), "int8": (30.0, 60.0)}, "t"),
        MeasuredCpu(
            "amx box",
            SAPPHIRE_RAPIDS,
            {"float32": (10.0, 150.0), "bfloat16": (40.0, 900.0), "int8": (30.0, 700.0)},
            "t",
        ),
    )
    monkeypatch.setattr(measured, "MEASURED", rows)
    return rows


def test_worker_flag_choices_are_the_paths():
    assert tuple(PATHS) == DTYPES[1:]
    assert DTYPES[0] == "auto"


def test_auto_takes_the_fastest_measured_path_the_cpu_has(table):
    path, why = select_path("auto", "cpu", SAPPHIRE_RAPIDS)
    assert path.name == "bfloat16"
    assert "amx box" in why
    # int8 measures fastest on the avx2 row, but auto never takes it (paths.py says
    # why): the next measured path is float32. Zen 5 matches only the avx2 row.
    assert select_path("auto", "cpu", ZEN3)[0].name == "float32"
    assert select_path("auto", "cpu", ZEN5)[0].name == "float32"
    assert select_path("int8", "cpu", ZEN3)[0].name == "int8"


def test_auto_on_an_unmeasured_cpu_follows_the_generic_order(table, monkeypatch):
    # q4_1 first where its kernels can be built (a C compiler), then native bfloat16.
    assert select_path("auto", "cpu", OLD_CPU)[0].name == "q4_1"
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert select_path("auto", "cpu", OLD_CPU)[0].name == "float32"
    path, why = select_path("auto", "cpu", frozenset({"avx512_bf16"}))
    assert path.name == "bfloat16"
    assert "generic" in why


def test_auto_without_the_own_forward_never_takes_int8(table):
    assert select_path("auto", "cpu", ZEN3, own_forward=False)[0].name == "float32"


def test_a_forced_path_the_cpu_lacks_fails_naming_the_feature(table):
    with pytest.raises(ComputePathUnavailableError, match="avx512_bf16 or amx_bf16"):
        select_path("bfloat16", "cpu", ZEN3)
    with pytest.raises(ComputePathUnavailableError, match="avx2"):
        select_path("int8", "cpu", OLD_CPU)
    with pytest.raises(ComputePathUnavailableError, match="own forward"):
        select_path("int8", "cpu", ZEN3, own_forward=False)
    assert select_path("float32", "cpu", OLD_CPU)[0].name == "float32"
    assert select_path("bfloat16", "cpu", ZEN5) == (PATHS["bfloat16"], "requested")


def test_cuda_takes_bfloat16_and_refuses_the_cpu_only_int8(table):
    assert select_path("auto", "cuda", frozenset())[0].name == "bfloat16"
    with pytest.raises(ComputePathUnavailableError, match="CPUs only"):
        select_path("int8", "cuda", frozenset())


def test_the_shipped_table_names_only_known_paths_and_positive_figures():
    assert measured.MEASURED, "bench/micro/kernels.py's figures belong in compute/measured.py"
    for cpu in measured.MEASURED:
        assert set(cpu.gflops) <= set(PATHS), cpu.name
        for m1, m64 in cpu.gflops.values():
            assert m64 > 0 and (m1 is None or m1 > 0), cpu.name
