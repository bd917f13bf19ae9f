"""The markdown table, its ratio columns, the JSON file and the progress bar."""

from __future__ import annotations

import io
import json
import math

from bench.harness.progress import Progress
from bench.harness.report import markdown_table, ratio, ratio_summary, write_json


def summary(throughput: float, ttft_median: float) -> dict:
    return {
        "completed": 4,
        "failed": 0,
        "output_throughput": throughput,
        "ttft_ms": {"mean": ttft_median, "median": ttft_median, "p99": math.nan},
    }


COLUMNS = {"cbserve": summary(300.0, 100.0), "static": summary(100.0, 500.0)}
RATIOS = [("cbserve vs static", "cbserve", "static")]


def test_ratios_read_times_better():
    assert ratio("output_throughput", 300.0, 100.0) == 3.0  # higher is better
    assert ratio("ttft_ms", 100.0, 500.0) == 5.0  # lower is better: baseline / ours
    assert ratio("completed", 4, 4) is None  # a count is no "better"
    assert ratio("mean_step_ms", 100.0, 50.0) is None  # steps of different batches
    assert ratio("ttft_ms", 0.0, 5.0) is None
    assert ratio("ttft_ms", math.nan, 5.0) is None


def test_markdown_table_has_a_column_per_run_and_the_ratio():
    lines = markdown_table(COLUMNS, RATIOS).splitlines()
    assert lines[0] == "| metric | cbserve | static | cbserve vs static |"
    assert lines[1] == "| --- | ---: | ---: | ---: |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["Successful requests"] == "| Successful requests | 4 | 4 |  |"
    assert rows["Output token throughput (tok/s)"].endswith("| 300 | 100 | 3.00x |")
    assert rows["TTFT median (ms)"].endswith("| 100 | 500 | 5.00x |")
    assert rows["TTFT p99 (ms)"].endswith("| n/a | n/a |  |")


def test_a_ratio_with_a_missing_column_is_left_out():
    table = markdown_table(COLUMNS, [("cbserve vs hf", "cbserve", "hf")])
    assert "vs hf" not in table


def test_ratio_summary_for_the_json_file():
    factors = ratio_summary(COLUMNS, RATIOS)["cbserve vs static"]
    assert factors == {
        "Output token throughput (tok/s)": 3.0,
        "TTFT mean (ms)": 5.0,
        "TTFT median (ms)": 5.0,
    }


def test_json_writes_nan_as_null(tmp_path):
    path = tmp_path / "sub" / "results.json"
    write_json(path, {"runs": [summary(1.0, 2.0)]})
    loaded = json.loads(path.read_text())
    assert loaded["runs"][0]["ttft_ms"] == {"mean": 2.0, "median": 2.0, "p99": None}


def test_progress_in_a_log_prints_a_line_per_tenth():
    stream = io.StringIO()
    with Progress(20, "run", stream) as bar:
        for _ in range(20):
            bar.update()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11  # 0/20, 2/20, ..., 20/20
    assert lines[-1].startswith("run [" + "#" * 30 + "] 20/20")
