"""`--dtype auto` and q4_1 with the shipped measured table (no machine read)."""

from __future__ import annotations

from worker_svc import native_build
from worker_svc.compute.measured import _ZEN4
from worker_svc.compute.selection import ComputePathUnavailableError, path_order, select_path

ZEN4 = _ZEN4 | {"sse4_2", "avx512cd", "avx512dq"}
ZEN5 = ZEN4 | {"avx_vnni"}
# The vector flags of the Ice Lake Xeon the project measured (bench/RESULTS.md).
ICE_LAKE = frozenset(
    {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw"}
    | {"avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg"}
)


def test_auto_takes_q4_1_on_the_measured_zen_4_only():
    path, why = select_path("auto", "cpu", ZEN4)
    assert path.name == "q4_1" and "Zen 4" in why
    assert select_path("auto", "cpu", ZEN5)[0].name == "bfloat16"  # measured there, not q4_1
    assert select_path("auto", "cpu", frozenset({"avx2", "fma"}))[0].name == "float32"
    assert select_path("auto", "cpu", ZEN4, own_forward=False)[0].name == "bfloat16"


def test_auto_takes_q4_1_on_the_measured_ice_lake():
    """Ice Lake has Zen 4's flags but avx512_bf16: its own row, not Zen 3's or Zen 4's."""
    path, why = select_path("auto", "cpu", ICE_LAKE)
    assert path.name == "q4_1" and "Ice Lake" in why
    order, _ = path_order(ICE_LAKE)
    assert order.index("q4_1") < order.index("float32")
    assert "Zen 4" in select_path("auto", "cpu", ZEN4)[1]  # Zen 4 keeps its own row


def test_auto_on_an_unmeasured_cpu_takes_q4_1_before_float32(monkeypatch):
    """No row matches a CPU without avx2/fma: the generic order, q4_1 first, never int8."""
    old = frozenset({"sse4_2"})
    path, why = select_path("auto", "cpu", old)
    assert path.name == "q4_1" and "generic" in why
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert select_path("auto", "cpu", old)[0].name == "float32"


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
