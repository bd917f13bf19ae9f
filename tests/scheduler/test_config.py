from __future__ import annotations

import pytest

from scheduler_svc.config import SchedulerConfig


def test_defaults():
    config = SchedulerConfig()
    assert config.max_num_seqs == 128
    assert config.max_num_batched_tokens == 512


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_num_seqs": 0},
        {"max_num_seqs": -1},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 2.5},
        {"max_num_batched_tokens": True},
    ],
)
def test_rejects_non_positive_or_non_integer_limits(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SchedulerConfig(**kwargs)


def test_a_budget_below_max_num_seqs_caps_the_running_sequences():
    assert SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32).max_running_seqs == 32
    assert SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32).max_running_seqs == 8
