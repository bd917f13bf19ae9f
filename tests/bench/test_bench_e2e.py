"""`cbserve bench --dataset random --num-prompts 3` against a real local stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def cbserve_command() -> list[str]:
    script = Path(sys.executable).with_name("cbserve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cbserve.cli"]


@pytest.mark.timeout(180)
def test_cbserve_bench_on_a_local_stack(model_dir, tmp_path):
    out_dir = tmp_path / "bench"
    argv = [
        *cbserve_command(),
        "bench",
        "--dataset", "random",
        "--num-prompts", "3",
        "--random-input-len", "8:32",
        "--random-output-len", "4:8",
        "--goodput", "ttft:60000",
        "--out-dir", str(out_dir),
    ]  # fmt: skip
    # From outside the checkout: the script must find bench/ by itself.
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("| metric | cbserve |")
    assert "cbserve, all at once [" in done.stderr  # the progress bar

    results = json.loads((out_dir / "results.json").read_text())
    asked = results["workload"]["total_output_tokens"]
    (run,) = results["runs"]
    summary = run["summary"]
    assert (summary["completed"], summary["failed"]) == (3, 0)
    assert summary["total_output_tokens"] == asked  # EOS ignored: exactly max_tokens
    assert summary["request_goodput"] == summary["request_throughput"]
    assert 0 < summary["ttft_ms"]["median"] <= summary["e2el_ms"]["median"]
    assert [r["finish_reason"] for r in run["requests"]] == ["LENGTH"] * 3
    assert (out_dir / "results.md").exists()
