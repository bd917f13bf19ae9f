"""bench.roofline.report: the FLOP counts, the share of a peak, the table and the JSON."""

from __future__ import annotations

import json

import pytest

from bench.roofline.peak import INSTRUCTIONS, PeakRate, PeakResult
from bench.roofline.report import (
    Achieved,
    achieved_lines,
    attention_flops,
    attention_kv_bytes,
    fraction_of_peak,
    matmul_flops,
    peak_lines,
    roofline_json,
)


def _peaks() -> dict[str, PeakResult]:
    """vpdpwssd at 50 GMAC/s on two threads (100 GFLOP/s-equivalent); vpdpbusd absent."""
    wssd = PeakResult(
        INSTRUCTIONS["vpdpwssd"],
        one_thread=PeakRate(1, 30e9, 28e9),
        all_threads=PeakRate(2, 50e9, 45e9),
    )
    busd = PeakResult(INSTRUCTIONS["vpdpbusd"], absent="this CPU lacks avx512_vnni")
    return {"vpdpwssd": wssd, "vpdpbusd": busd}


def _row(instruction: str | None = "vpdpwssd", **kwargs) -> Achieved:
    fields = dict(
        what="q4_1 (GGUF blocks)",
        rows=64,
        kernel="VNNI kernel",
        instruction=instruction,
        flops=matmul_flops(64, 1000, 500),  # 64 MFLOP
        median_seconds=1e-3,
        best_seconds=0.8e-3,
        bytes_read=2e6,
        shapes_gflops={"qkv": 70.0, "lm_head": 40.0},
    )
    return Achieved(**{**fields, **kwargs})


def test_a_matmul_counts_a_multiply_and_an_add_per_weight_and_row():
    assert matmul_flops(64, 960, 576) == 2 * 64 * 960 * 576
    assert matmul_flops(1, 49152, 576) == 2 * 49152 * 576


def test_decode_attention_counts_q_dot_k_and_the_sum_of_v_per_query_head():
    lens = [256] * 64
    # 9 query heads of 64: per key, 64 MACs for q.k and 64 for p.v, each 2 FLOPs.
    assert attention_flops(lens, heads=9, head_dim=64) == 64 * 256 * 9 * (2 * 64 + 2 * 64)
    # K and V are read once per KV head, not per query head: GQA's 3 here.
    assert attention_kv_bytes(lens, kv_heads=3, head_dim=64, element_bytes=2) == (
        2 * 64 * 256 * 3 * 64 * 2
    )


def test_an_achieved_rate_is_its_flops_over_its_median_against_the_best_peak():
    row = _row()
    assert row.gflops == pytest.approx(64.0)
    assert row.best_gflops == pytest.approx(80.0)
    # 64 GFLOP/s over 2 x 50 GMAC/s: the best all-threads run is the limit.
    assert fraction_of_peak(row, _peaks()) == pytest.approx(0.64)


def test_a_kernel_on_an_absent_or_unknown_instruction_has_no_share():
    assert fraction_of_peak(_row("vpdpbusd"), _peaks()) is None
    assert fraction_of_peak(_row(None), _peaks()) is None


def test_a_row_with_its_best_slower_than_its_median_is_refused():
    with pytest.raises(ValueError, match="best <= median"):
        _row(best_seconds=2e-3)


def test_the_peak_table_gives_both_thread_counts_and_names_an_absent_instruction():
    lines = peak_lines(_peaks(), threads=2)
    (wssd,) = [line for line in lines if line.startswith("vpdpwssd")]
    assert "30.0 (  28.0)" in wssd and "50.0 (  45.0)" in wssd
    assert wssd.split()[-1] == "100.0"  # GFLOP/s-equivalent: 2 x 50 GMAC/s
    (busd,) = [line for line in lines if line.startswith("vpdpbusd")]
    assert "absent: this CPU lacks avx512_vnni" in busd


def test_the_achieved_table_prints_the_share_the_bandwidth_and_each_projection():
    lines = achieved_lines([_row(), _row("vpdpbusd", shapes_gflops={})], _peaks())
    assert lines[1].split()[-2:] == ["qkv", "lm_head"]
    cells = lines[2].split()
    assert "64.0%" in cells and "2.0" in cells  # 2 MB in 1 ms
    assert cells[-2:] == ["70.0", "40.0"]
    assert lines[3].split()[-2:] == ["-", "2.0"]  # no peak to compare with: no share


def test_the_json_holds_every_peak_and_row_with_its_share():
    header = {"cpu": "test CPU", "threads": 2}
    out = json.loads(json.dumps(roofline_json(header, _peaks(), [_row()], ["torch bfloat16: x"])))
    assert out["cpu"] == "test CPU" and out["not_timed"] == ["torch bfloat16: x"]
    by_name = {peak["instruction"]: peak for peak in out["peaks"]}
    assert by_name["vpdpbusd"]["absent"] == "this CPU lacks avx512_vnni"
    assert by_name["vpdpwssd"]["all_threads"]["best_gflops_equivalent"] == pytest.approx(100.0)
    assert by_name["vpdpwssd"]["macs_per_instruction"] == 32
    (row,) = out["achieved"]
    assert row["fraction_of_peak"] == pytest.approx(0.64)
    assert row["bytes_per_second"] == pytest.approx(2e9)
    assert row["shapes_gflops"] == {"qkv": 70.0, "lm_head": 40.0}
