"""The random dataset and its length ranges."""

from __future__ import annotations

import pytest

from bench.harness.workload import describe, make_workload, parse_range, random_requests


def test_parse_range():
    assert parse_range("128") == (128, 128)
    assert parse_range("16:128") == (16, 128)
    for bad in ("0", "9:3", "a:b", ""):
        with pytest.raises(ValueError):
            parse_range(bad)


def test_random_requests_respect_ranges_and_seed():
    vocab = list(range(100, 200))
    requests = random_requests(50, 3, vocab, (5, 9), (2, 4))
    assert requests == random_requests(50, 3, vocab, (5, 9), (2, 4))
    assert requests != random_requests(50, 4, vocab, (5, 9), (2, 4))
    assert {r.prompt_len for r in requests} <= set(range(5, 10))
    assert {r.max_tokens for r in requests} <= {2, 3, 4}
    assert all(100 <= token < 200 for r in requests for token in r.prompt_token_ids)
    assert [r.index for r in requests] == list(range(50))


def test_random_workload_leaves_out_special_tokens(model_dir, tokenizer):
    requests = make_workload("random", 8, 0, model_dir, input_len=(64, 64))
    assert all(r.prompt_len == 64 for r in requests)
    special = tokenizer.special_token_ids
    assert not any(token in special for r in requests for token in r.prompt_token_ids)
    described = describe(requests, "random", 0)
    assert described["total_prompt_tokens"] == 8 * 64
    assert described["prompt_len_min_max"] == [64, 64]
