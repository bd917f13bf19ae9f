"""The offline replay behind `python -m bench.speculation.ceiling`: steps counted as
greedy speculation takes them, and the oracle never below the worker's lookup."""

from __future__ import annotations

import pytest

from bench.speculation.ceiling import lookup, oracle, replay

# The reply copies the prompt's run 10..29 and then leaves it.
PROMPT = list(range(40))
REPLY = list(range(10, 30)) + [99, 98, 97]


def test_a_copied_reply_takes_k_plus_one_tokens_a_step():
    # The first step has nothing to follow in the reply yet: the prompt's last two tokens
    # (38, 39) occurred once, with nothing after them, so no draft; then 10 follows 39...
    tokens_per_step, drafts_per_step, acceptance = replay([(PROMPT, REPLY)], lookup(2, 4), 4)
    assert 1.0 < tokens_per_step <= 5.0
    assert 0.0 < acceptance <= 1.0
    assert drafts_per_step <= 4


@pytest.mark.parametrize("k", [1, 3, 8])
def test_the_oracle_is_at_least_the_lookup(k):
    pairs = [(PROMPT + [10, 11], REPLY), ([5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6], [7, 5, 6, 9, 1])]
    for min_n in (1, 2):
        found = replay(pairs, lookup(min_n, 4), k)[0]
        best = replay(pairs, oracle(min_n), k)[0]
        assert best >= found


def test_a_reply_with_nothing_to_look_up_takes_a_step_a_token():
    tokens_per_step, drafts_per_step, _ = replay([([1, 2, 3], [50, 51, 52, 53])], lookup(2, 4), 8)
    assert tokens_per_step == 1.0
    assert drafts_per_step == 0.0
