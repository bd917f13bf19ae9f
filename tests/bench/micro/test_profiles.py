"""The profiling scripts RESULTS.md quotes, run small so that they keep working."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.process


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_attention_profile_times_both_paths_and_they_agree(kv_dtype, run_module):
    out = run_module(
        "bench.micro.attention_profile", "--batch", "5", "--context", "3:70",
        "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--block-size", "4",
        "--repeats", "1", "--kv-cache-dtype", kv_dtype,
    )  # fmt: skip
    for path in ("torch", "cpu"):
        line = rf"^{path} +{kv_dtype} pool, batch=5 context=3\.\.70 .* ms/layer$"
        assert re.search(line, out, re.MULTILINE)
    difference = float(out.rsplit(":", 1)[1])
    assert difference < 1e-4


def test_step_profile_runs_a_served_shaped_step(model_dir, run_module):
    out = run_module(
        "bench.micro.step_profile", "--batch", "3", "--context", "5:40", "--prefill", "20",
        "--steps", "2", "--threads", "1",
    )  # fmt: skip
    line = out.strip().splitlines()[-1]
    assert line.startswith("float32 cpu threads=1 batch=3 context=5..40"), line
    assert "prefill=20" in line
    # The step's time and throughput, then what the set-up took (compiles, with --compile).
    assert re.search(r"ms/step \(min [\d.]+\), \d+ decode tokens/s; set-up prefills", line)


def test_measure_dtype_times_decode_and_prefill(model_dir, run_module):
    out = run_module(
        "bench.micro.measure_dtype", "--batch", "2", "--context", "10", "--prefill", "16",
        "--steps", "1", "--threads", "1", "--dtypes", "float32",
    )  # fmt: skip
    line = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"float32 +decode batch=2 ctx=10: +[\d.]+ ms/step +prefill 16 tokens: +[\d.]+ ms", line
    ), line
