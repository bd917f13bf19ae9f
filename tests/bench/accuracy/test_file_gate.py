"""`cbserve bench accuracy --model FILE.gguf`: the flags' plan and the file's verdict
against llama.cpp, from recorded figures (bench/accuracy/file_gate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.accuracy.file_gate import file_table, file_verdict, plan
from bench.accuracy.gate import REPLY_TOKENS, main
from tests.bench.accuracy.test_reference import write_gguf


def default_paths():
    return ["float32", "q4_1", "bfloat16"]


def chosen_by_auto(gguf):
    return "q4_1"


def test_without_a_gguf_the_paths_run_on_the_default_model_beside_the_shipped_file(tmp_path):
    shipped = tmp_path / "shipped.gguf"
    made = plan(None, None, None, shipped, "/models/default", default_paths)
    assert made.runs == (
        ("float32", "/models/default", "float32"),
        ("q4_1", "/models/default", "q4_1"),
        ("bfloat16", "/models/default", "bfloat16"),
    )
    assert made.gguf == shipped and not made.file_mode and made.llamacpp_label == "Q4_1"
    # Another directory: llama.cpp has no file of it.
    other = plan("/models/other", None, ["q4_1"], shipped, "/models/default", default_paths)
    assert other.gguf is None and other.runs[1] == ("q4_1", "/models/other", "q4_1")


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_a_gguf_runs_on_autos_path_against_its_reference(tmp_path):
    model, reference = write_gguf(tmp_path / "m.gguf"), write_gguf(tmp_path / "ref.gguf")
    made = plan(str(model), str(reference), None, None, "/d", default_paths, chosen_by_auto)
    assert made.runs == (("float32", str(reference), "float32"), ("q4_1", str(model), "q4_1"))
    assert made.file_mode and made.gguf == model and made.llamacpp_label == "m.gguf"
    asked = plan(str(model), str(reference), ["float32", "q4_1"], None, "/d", default_paths)
    assert [label for label, _, _ in asked.runs] == ["float32", "float32 (file)", "q4_1"]
    assert asked.runs[1][1] == str(model)  # the file's own weights, not the reference


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_the_flags_are_refused_with_a_reason(tmp_path, capsys):
    with pytest.raises(ValueError, match="--reference is for a GGUF"):
        plan("/models/dir", "/models/ref", None, None, "/d", default_paths)
    with pytest.raises(ValueError, match="no such file"):
        plan(str(tmp_path / "absent.gguf"), None, None, None, "/d", default_paths)
    model = write_gguf(tmp_path / "m.gguf")
    wide = write_gguf(tmp_path / "wide.gguf", hidden=64, dtype=np.float16)
    with pytest.raises(SystemExit) as done:
        main(["--model", str(model), "--reference", str(wide)])
    assert done.value.code == 2
    assert "is not the model of m.gguf" in capsys.readouterr().err


def recorded_report(ours_ppl: float, ours_equal: int, theirs: dict, replies: dict) -> dict:
    row = {"chunked": {"perplexity": ours_ppl}, "equal_replies": ours_equal, "replies": [[0]] * 16}
    return {
        "reference": "/models/SmolLM2",
        "paths": {"float32": {"chunked": {"perplexity": 9.0}}, "q4_1": row},
        "chunked": {"gguf": "/cache/SmolLM2-135M-Instruct.Q4_K_M.gguf", "llama.cpp": theirs},
        "llama.cpp replies": replies,
    }


def test_the_file_is_held_to_llamacpp_on_the_same_file():
    met = file_verdict(
        recorded_report(9.40, 9, {"perplexity": 9.35}, {"equal_replies": 5, "replies": []})
    )["q4_1"]
    assert met["passes"] and met["perplexity_met"] and met["replies_met"]
    assert met["ratio"] == pytest.approx(9.40 / 9.35)
    worse = file_verdict(
        recorded_report(9.50, 4, {"perplexity": 9.35}, {"equal_replies": 5, "replies": []})
    )["q4_1"]
    assert worse["perplexity_met"] is False and worse["replies_met"] is False
    assert worse["passes"] is False
    unjudged = file_verdict(
        recorded_report(9.40, 9, {"skipped": "not built"}, {"skipped": "not built"})
    )["q4_1"]
    assert unjudged["passes"] is None and "llama_perplexity" not in unjudged


def test_the_file_table_shows_both_sides():
    report = recorded_report(9.40, 9, {"perplexity": 9.35}, {"equal_replies": 5, "replies": []})
    report["file"] = file_verdict(report)
    text = file_table(report, REPLY_TOKENS)
    assert "SmolLM2-135M-Instruct.Q4_K_M.gguf against llama.cpp" in text
    assert "| q4_1 | 9.4000 | 9.3500 | 1.0053x | 9/16 | 5/16 |" in text
    assert "perplexity within 1%: yes; replies: yes" in text
