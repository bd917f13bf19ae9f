"""The benchmark's tests: pure Python, plus one real stack for the end-to-end run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.defaults import converted_model_dir


@pytest.fixture(scope="session")
def model_dir():
    path = converted_model_dir()
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"no converted model at {path} (make model)")
    return path


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from scheduler_svc.api.tokenizer import Tokenizer

    return Tokenizer(model_dir)


@pytest.fixture
def run_module():
    """Runs `python -m MODULE ARGS...` (a script that RESULTS.md quotes) and returns its
    stdout; fails with its stderr's tail."""

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    return run
