"""bench.micro.attention_ab runs two kernel builds in turn and prints a row for each case."""

from __future__ import annotations

import subprocess
import sys

import pytest

from worker_svc.attention.cpu_kernel import load_kernel


@pytest.mark.process  # python -m bench.attention_ab
def test_a_build_against_itself_prints_every_case():
    build = load_kernel()._name
    argv = [sys.executable, "-m", "bench.micro.attention_ab", build, build]
    run = subprocess.run(
        [*argv, "--calls", "2", "--batch", "4", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line for line in run.stdout.splitlines() if "median" in line]
    assert [row.split("  median")[0].strip() for row in rows] == [
        "old, float32 pool",
        "new, float32 pool",
        "new, float16 pool",
    ]
