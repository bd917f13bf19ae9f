"""PNG plots when matplotlib is there, one clear message when it is not."""

from __future__ import annotations

import math

import pytest

from bench.harness import plots

CURVES = {"cbserve": [(1.0, 100.0), (2.0, 180.0), (math.inf, 250.0)], "static": [(1.0, 60.0)]}
SAMPLES = {"cbserve": [10.0, 20.0, 0.0, 35.0], "static": [40.0, 90.0]}


def test_all_three_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    written = plots.write_plots(tmp_path, CURVES, SAMPLES, SAMPLES)
    assert [p.name for p in written] == ["throughput.png", "ttft.png", "itl.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_throughput_curve_from_a_single_finite_rate(tmp_path):
    pytest.importorskip("matplotlib")
    written = plots.write_plots(tmp_path, {"cbserve": [(math.inf, 1.0), (2.0, 1.0)]}, {}, {})
    assert written == []


def test_without_matplotlib_plotting_is_skipped_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plots, "pyplot", lambda: None)
    assert plots.write_plots(tmp_path, CURVES, SAMPLES, SAMPLES) == []
    assert "matplotlib is not installed" in capsys.readouterr().err
