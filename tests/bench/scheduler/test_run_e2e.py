"""`cbserve bench scheduler` end to end with tiny settings: two null workers, a real
scheduler, both fronts and the bare floor server; every request completes with its tokens."""

from __future__ import annotations

import json

import pytest

from cbserve.cli import main

# Starts real processes (null workers need no weights).
pytestmark = pytest.mark.process


def test_bench_scheduler_runs_both_fronts_and_the_floor(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["bench", "scheduler", "--loads", "2x2:4", "--requests-per-stream", "2"]
    argv += ["--prompt-len", "8", "--output-len", "12", "--out-dir", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [row["front"] for row in rows] == ["grpc", "http", "bare"]
    for row in rows:
        assert row["requests"] == row["completed"] == 8 and not row["errors"]
        assert row["tokens"] == 8 * 12 and row["cpu_s"]
    grpc, http, _ = rows
    for row in (grpc, http):
        # Two workers stepped, each at least the 12 steps of its requests.
        assert row["worker_steps"] >= 24 and row["worker_busy_s"] > 0
        assert row["derived"]["capacity_tok_s"] == 2 * 2 / 0.002
        assert set(row["cpu_s"]) >= {"scheduler", "worker0", "worker1"}
    printed = capsys.readouterr().out
    assert "| 2 workers, 2 ms steps, 4 streams | grpc |" in printed
    assert (out / "results.md").read_text().strip() == printed.strip()
    assert (out / "throughput.png").stat().st_size > 0 and (out / "cpu.png").stat().st_size > 0
    assert "request finished" in (out / "stack.log").read_text()


def test_constrained_streams_get_a_free_streams_tokens_with_null_workers(tmp_path, capsys):
    """Deferred masks through real processes: the null worker's sampler waits for the
    masks the scheduler sends after each result, so a constrained row samples every
    step (before them, every other step: about half a free stream's tokens)."""
    out = tmp_path / "out"
    argv = ["bench", "scheduler", "--loads", "1x10:4/regex50", "--requests-per-stream", "2"]
    argv += ["--prompt-len", "8", "--output-len", "48", "--fronts", "grpc", "--no-floor"]
    argv += ["--no-plots", "--out-dir", str(out)]
    assert main(argv) == 0
    [row] = json.loads((out / "results.json").read_text())
    assert row["requests"] == row["completed"] == 8 and not row["errors"]
    constrained = row["constrained_tokens"] / row["constrained_stream_s"]
    free = (row["tokens"] - row["constrained_tokens"]) / row["free_stream_s"]
    assert constrained >= 0.85 * free, (constrained, free)
    assert "regex-constrained) | grpc |" in capsys.readouterr().out
    log = (out / "stack.log").read_text()
    assert "request finished" in log and "deferred_masks_missing" not in log
