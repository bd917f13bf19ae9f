"""`--dtype auto` and q4_1 with the shipped measured table (no machine read)."""

from __future__ import annotations

from worker_svc import native_build
from worker_svc.compute.measured import _ZEN4
from worker_svc.compute.selection import ComputePathUnavailableError, select_path

ZEN4 = _ZEN4 | {"sse4_2", "avx512cd", "avx512dq"}
ZEN5 = ZEN4 | {"avx_vnni"}


def test_auto_takes_q4_1_on_the_measured_zen_4_only():
    path, why = select_path("auto", "cpu", ZEN4)
    assert path.name == "q4_1" and "Zen 4" in why
    assert select_path("auto", "cpu", ZEN5)[0].name == "bfloat16"  # measured there, not q4_1
    assert select_path("auto", "cpu", frozenset({"avx2", "fma"}))[0].name == "float32"
    assert select_path("auto", "cpu", ZEN4, own_forward=False)[0].name == "bfloat16"


def test_q4_1_runs_on_any_cpu_with_a_compiler(monkeypatch):
    assert select_path("q4_1", "cpu", frozenset())[0].name == "q4_1"
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert select_path("auto", "cpu", ZEN4)[0].name == "bfloat16"
    try:
        select_path("q4_1", "cpu", ZEN4)
    except ComputePathUnavailableError as exc:
        assert "C compiler" in str(exc)
    else:
        raise AssertionError("q4_1 without a compiler was accepted")
