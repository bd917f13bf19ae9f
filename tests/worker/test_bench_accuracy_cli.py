"""`cbserve bench accuracy` and `python -m bench accuracy` reach bench/accuracy/gate.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.accuracy.gate import GATE_PPL_RATIO, GATE_REPLIES, REPLY_TOKENS
from bench.micro.kv_suffix import split_kv_suffix
from cbserve.cli import main


def test_cbserve_bench_accuracy_has_its_own_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["bench", "accuracy", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "cbserve bench accuracy" in out and "--texts" in out


@pytest.mark.process
def test_python_m_bench_accuracy():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "accuracy", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--max-text-tokens" in done.stdout


def test_the_gate_is_the_issues():
    assert (GATE_PPL_RATIO, GATE_REPLIES, REPLY_TOKENS) == (1.01, 12, 12)


def test_a_path_names_its_kv_pool_after_a_plus():
    assert split_kv_suffix("q4_1") == ("q4_1", "auto")
    assert split_kv_suffix("q4_1+kv16") == ("q4_1", "float16")
    assert split_kv_suffix("float32+kvbf16") == ("float32", "bfloat16")
    with pytest.raises(ValueError, match=r"\+kv16"):
        split_kv_suffix("q4_1+fp8")
