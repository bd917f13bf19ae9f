"""`cbserve bench --dataset random --num-prompts 3` against a real local stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.model]


def cbserve_command() -> list[str]:
    script = Path(sys.executable).with_name("cbserve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cbserve.cli"]


# 30 s of a real benchmark run: `make test-slow` runs it.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cbserve_bench_on_a_local_stack(model_dir, tmp_path):
    """`make bench` in small: the same command with both baselines, on three prompts."""
    out_dir = tmp_path / "bench"
    argv = [
        *cbserve_command(),
        "bench",
        "--dataset", "random",
        "--num-prompts", "3",
        "--random-input-len", "8:32",
        "--random-output-len", "4:8",
        "--goodput", "ttft:60000",
        "--baselines", "static,hf",
        "--out-dir", str(out_dir),
    ]  # fmt: skip
    # From outside the checkout: the script must find bench/ by itself.
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    header = done.stdout.splitlines()[0]
    assert header == (
        "| metric | cbserve | static | transformers float32 | cbserve vs static "
        "| cbserve vs transformers |"
    )
    assert "cbserve, all at once [" in done.stderr  # the progress bar

    results = json.loads((out_dir / "results.json").read_text())
    asked = results["workload"]["total_output_tokens"]
    runs = {run["system"]: run for run in results["runs"]}
    assert set(runs) == {"cbserve", "static", "hf"}
    for system, run in runs.items():
        summary = run["summary"]
        assert (summary["completed"], summary["failed"]) == (3, 0), system
        assert summary["total_output_tokens"] == asked  # EOS ignored: exactly max_tokens
        assert 0 < summary["ttft_ms"]["median"] <= summary["e2el_ms"]["median"]
        assert [r["finish_reason"] for r in run["requests"]] == ["LENGTH"] * 3
    served = runs["cbserve"]["summary"]
    assert served["request_goodput"] == served["request_throughput"]
    # The served systems report how their steps split; transformers has no server.
    for system in ("cbserve", "static"):
        summary = runs[system]["summary"]
        assert summary["steps"] >= 4  # a prefill, then a decode per further token (4 to 8)
        assert 0 < summary["step_overhead_pct"] < 100
        assert summary["mean_step_ms"] > 0
    assert "step_overhead_pct" not in runs["hf"]["summary"]
    assert "Step time outside forward (%, server)" in done.stdout
    assert (out_dir / "results.md").exists()
    roofline = [line for line in done.stdout.splitlines() if line.startswith("Roofline: ")]
    assert len(roofline) == 1, done.stdout[-2000:]
    assert "GFLOP/s -> at most" in roofline[0] and "cbserve" in roofline[0]
    assert roofline[0] in (out_dir / "results.md").read_text()
