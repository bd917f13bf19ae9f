"""What `cbserve bench speculation` writes from its recorded runs (no server started)."""

from __future__ import annotations

import json

from bench.speculation.acceptance import Acceptance
from bench.speculation.config import SpeculationBenchConfig
from bench.speculation.report import OFF, ON, Run
from bench.speculation.run import write


def test_results_name_the_cpu_and_the_settings_and_flag_differing_replies(tmp_path):
    config = SpeculationBenchConfig(servers=["cbserve"], out_dir=tmp_path)
    runs = [
        Run("edit", 1, "cbserve", OFF, 400, 10.0),
        Run("edit", 1, "cbserve", ON, 401, 5.0, acceptance=Acceptance(50, 200, 100)),
    ]
    text = write(config, runs, ["llama.cpp not measured: not built"], "cbserve bench speculation")
    assert (tmp_path / "results.md").read_text() == text
    assert "CPU: " in text and "`cbserve bench speculation`" in text
    assert config.speculative_config in text
    assert "llama-server `" not in text  # not asked for: its flags are not shown
    assert "| edit | 1 | cbserve | 40.0 | 80.2 | 2.00x | 3.00 | 0.500 | 400 / 401 |" in text
    assert "- llama.cpp not measured: not built" in text
    assert "different token counts" in text
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["command"] == "cbserve bench speculation"
    assert [r["speculation"] for r in record["runs"]] == [OFF, ON]
    assert record["runs"][1]["acceptance"]["mean_acceptance_length"] == 3.0
