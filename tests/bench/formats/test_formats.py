"""`cbserve bench formats`: its flags, the command lines it runs, and the table made from
recorded figures (no llama.cpp needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.formats.run import accuracy_argv, parser, speed_argvs
from bench.formats.table import (
    FileAccuracy,
    FormatRow,
    Speed,
    accuracy_from_report,
    markdown,
    speed_from_results,
    speed_from_rounds,
)


def test_the_flags_default_to_the_issues_table_and_refuse_unknown_files():
    args = parser("cbserve bench formats").parse_args([])
    assert args.files == ["shipped", "q4_k_m", "q8_0", "qwen3-q4_k_m", "qwen3moe-q4_k_m"]
    assert (args.threads, args.num_prompts, args.stream_tokens) == (2, 64, 128)
    narrowed = parser("p").parse_args(["--files", "q8_0", "--skip", "speed"])
    assert narrowed.files == ["q8_0"] and narrowed.skip == ["speed"]
    for bad in (["--files", "q5_k_m"], ["--files", ","], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            parser("p").parse_args(bad)


def test_both_systems_get_the_same_file_and_threads():
    args = parser("p").parse_args(["--num-prompts", "4", "--stream-tokens", "8"])
    gguf, out = Path("/c/f.Q8_0.gguf"), Path("/o/q8_0")
    runs = speed_argvs(gguf, args, out)
    at_once, stream = runs["at_once"], runs["one_stream"]
    assert at_once[:3] == [sys.executable, "-m", "bench"]
    # One stream: both servers side by side in alternated rounds (bench/formats/one_stream.py).
    assert stream[:3] == [sys.executable, "-m", "bench.formats.one_stream"]
    for argv in (at_once, stream):
        assert argv[argv.index("--model") + 1] == str(gguf)
        assert argv[argv.index("--threads") + 1] == "2"
    assert at_once[at_once.index("--baselines") + 1] == "llamacpp"
    assert at_once[at_once.index("--num-prompts") + 1] == "4"
    assert stream[stream.index("--tokens") + 1] == "8"
    assert stream[stream.index("--rounds") + 1] == "9"
    assert at_once[-1] == "/o/q8_0/at-once" and stream[-1] == "/o/q8_0/one-stream.json"
    accuracy = accuracy_argv(gguf, Path("/c/qwen3"), args, out)
    assert accuracy[3:6] == ["accuracy", "--model", str(gguf)]
    assert accuracy[accuracy.index("--reference") + 1] == "/c/qwen3"
    assert "--reference" not in accuracy_argv(gguf, None, args, out)


RESULTS = {  # the parts of a `cbserve bench` results.json that are read
    "runs": [
        {"system": "cbserve", "summary": {"output_throughput": 190.0}},
        {"system": "llamacpp", "summary": {"output_throughput": 130.0}},
    ],
    "errors": [],
}
REPORT = {  # the parts of a `cbserve bench accuracy --json` report in file mode
    "file": {
        "q4_1": {
            "perplexity": 9.4012,
            "llama_perplexity": 9.3519,
            "equal_replies": 9,
            "llama_server_replies": 5,
            "questions": 16,
        }
    }
}


def test_the_figures_are_read_from_the_runs_files():
    speed = speed_from_results(RESULTS)
    assert (speed.ours, speed.theirs) == (190.0, 130.0)
    assert speed.ratio == pytest.approx(1.4615, abs=1e-4)
    with pytest.raises(ValueError, match="no llamacpp run; errors: \\['llama.cpp not measured'\\]"):
        speed_from_results({"runs": RESULTS["runs"][:1], "errors": ["llama.cpp not measured"]})
    accuracy = accuracy_from_report(REPORT)
    assert accuracy.path == "q4_1" and accuracy.llama_server_replies == 5
    with pytest.raises(ValueError, match="no file rows"):
        accuracy_from_report({"paths": {}})


def test_the_one_stream_figure_is_the_median_ratio_of_its_rounds():
    record = {
        "rounds": [],
        "summary": {
            "rounds": 9,
            "cbserve_median": 250.0,
            "llamacpp_median": 360.0,
            "median_ratio": 0.71,
            "best_ratio": 0.68,
        },
    }
    speed = speed_from_rounds(record)
    assert speed.ratio == 0.71  # not 250 / 360
    assert speed.cell() == "250.0 vs 360.0: 0.71x (median of 9 alternated rounds)"


def test_the_table_names_the_cpu_and_puts_each_side_beside_the_other():
    rows = [
        FormatRow(
            "SmolLM2 Q4_K_M",
            Speed(190.0, 130.0),
            Speed(25.9, 123.8),
            accuracy_from_report(REPORT),
        ),
        FormatRow("SmolLM2 Q8_0", at_once=Speed(186.0, 128.0)),
        FormatRow("Qwen3 Q4_K_M", accuracy=FileAccuracy("q4_1", 12.5, None, 7, None, 16)),
    ]
    text = markdown(rows, "AMD EPYC 9R14", 2, "64 prompts")
    lines = text.splitlines()
    assert lines[0] == "AMD EPYC 9R14; 2 threads each; 64 prompts"
    assert lines[4] == (
        "| SmolLM2 Q4_K_M | q4_1 | 190.0 vs 130.0: 1.46x | 25.9 vs 123.8: 0.21x "
        "| 9.4012 vs 9.3519: 1.0053x | 9 vs 5 of 16 |"
    )
    assert lines[5] == "| SmolLM2 Q8_0 |  | 186.0 vs 128.0: 1.45x | not run | not run | not run |"
    assert "12.5000 (llama-perplexity left out)" in lines[6] and "| 7 of 16 |" in lines[6]


def test_the_settings_line_names_only_the_parts_run_and_the_header_the_prompt_count():
    from bench.formats.run import settings_line

    speed_only = parser("p").parse_args(["--skip", "accuracy", "--num-prompts", "2"])
    line = settings_line(speed_only, "2026-11-26 16:08 UTC", "cbserve bench formats")
    assert line.startswith("2026-11-26 16:08 UTC; at once: 2 ShareGPT prompts")
    assert "accuracy" not in line and line.endswith("; `cbserve bench formats`")
    both = settings_line(parser("p").parse_args([]), "t", "c")
    assert "128 tokens" in both and "accuracy: 16 texts" in both
    header = markdown([], "cpu", 2, "s", at_once=2).splitlines()[2]
    assert "| 2 prompts at once, tok/s" in header
