"""`cbserve bench speculation`'s flags: defaults, what each run is started with, refusals."""

from __future__ import annotations

import subprocess

import pytest

from bench.peers import llama_server
from bench.speculation.config import SpeculationBenchConfig
from bench.speculation.run import _order


def test_defaults_measure_the_issues_setting_on_every_workload():
    config = SpeculationBenchConfig()
    assert config.workload == ["edit", "summarize", "chat"]
    assert config.concurrency == [1, 64]
    assert config.speculative.num_speculative_tokens == 4
    assert (config.speculative.prompt_lookup_min, config.speculative.prompt_lookup_max) == (2, 4)
    assert config.prompts_for(1) == 8 and config.prompts_for(64) == 128
    assert SpeculationBenchConfig(num_prompts=3).prompts_for(64) == 3


def test_only_the_on_runs_get_the_speculative_config():
    config = SpeculationBenchConfig(scheduler_args="--max-num-seqs 128", threads=2)
    assert config.scheduler_argv(False) == ["--max-num-seqs", "128"]
    assert config.scheduler_argv(True) == [
        "--max-num-seqs", "128", "--speculative-config", config.speculative_config
    ]  # fmt: skip
    assert config.worker_argv() == ["--threads", "2"]


def test_llama_server_gets_its_ngram_simple_with_the_same_sizes_unless_told():
    config = SpeculationBenchConfig(
        speculative_config='{"num_speculative_tokens": 6, "prompt_lookup_min": 3}'
    )
    assert config.llamacpp_spec_argv() == [
        "--spec-type", "ngram-simple",
        "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "6",
    ]  # fmt: skip
    mine = SpeculationBenchConfig(llamacpp_spec_args="--spec-type ngram-mod")
    assert mine.llamacpp_spec_argv() == ["--spec-type", "ngram-mod"]


@pytest.mark.parametrize(
    "fields",
    [
        {"speculative_config": ""},
        {"speculative_config": '{"method": "eagle", "num_speculative_tokens": 2}'},
        {"workload": ["translate"]},
        {"servers": ["vllm"]},
        {"concurrency": [0]},
        {"repeats": 0},
        {"num_prompts": 0},
        {"scheduler_args": "--x 'unclosed"},
    ],
)
def test_bad_settings_are_refused_at_construction(fields):
    with pytest.raises(ValueError):
        SpeculationBenchConfig(**fields)


def test_off_and_on_take_turns_going_first():
    assert [_order(repeat) for repeat in range(3)] == [("off", "on"), ("on", "off"), ("off", "on")]


# runs a program: not the fast tier (tests/tiers.py)
@pytest.mark.process
def test_the_built_llama_server_has_the_ngram_speculation_the_bench_asks_for():
    binary = llama_server.binary_path()
    if binary is None:
        pytest.skip(llama_server.MISSING)
    shown = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    flags = SpeculationBenchConfig().llamacpp_spec_argv()
    assert "ngram-simple" in shown.stdout
    for flag in flags[::2]:
        assert flag in shown.stdout
    assert "--metrics" in shown.stdout
