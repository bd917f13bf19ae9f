from __future__ import annotations

import pytest

from scheduler_svc.config import SchedulerConfig


def test_defaults():
    config = SchedulerConfig()
    assert config.max_num_seqs == 128
    assert config.max_num_batched_tokens == 512
    assert config.num_scheduler_steps == 1  # a plan per token, unless asked


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_num_seqs": 0},
        {"max_num_seqs": -1},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 2.5},
        {"max_num_batched_tokens": True},
        {"num_scheduler_steps": 0},
        {"num_scheduler_steps": 1.5},
    ],
)
def test_rejects_non_positive_or_non_integer_limits(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SchedulerConfig(**kwargs)


def test_a_budget_below_max_num_seqs_caps_the_running_sequences():
    assert SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32).max_running_seqs == 32
    assert SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32).max_running_seqs == 8


def test_memory_pressure_defaults():
    config = SchedulerConfig()
    assert config.enable_prefix_caching and config.batching == "continuous"
    assert (config.max_waiting_requests, config.max_bypasses, config.watermark) == (1024, 16, 0.01)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_waiting_requests": 0}, "max_waiting_requests"),
        ({"max_bypasses": -1}, "max_bypasses"),
        ({"max_bypasses": True}, "max_bypasses"),
        ({"max_bypasses": 1.5}, "max_bypasses"),
        ({"watermark": -0.1}, "watermark"),
        ({"watermark": 1.0}, "watermark"),
        ({"batching": "dynamic"}, "batching"),
    ],
)
def test_rejects_bad_memory_pressure_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)


def test_zero_bypasses_is_allowed():
    # Strict first come, first served: the queue waits at any request that does not fit.
    assert SchedulerConfig(max_bypasses=0).max_bypasses == 0
