"""The near-tie comparison of greedy replies (tests/near_ties.py) on made-up logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.near_ties import NEAR_TIE_NATS, assert_same_reply_up_to_a_near_tie, first_difference


@dataclass
class Top:
    token_id: int
    logprob: float


@dataclass
class Position:
    top_logprobs: list[Top]


@dataclass
class Reply:
    tokens: list[int]
    logprobs: list[Position] = field(default_factory=list)


def reply(tokens: list[int], tops: dict[int, dict[int, float]]) -> Reply:
    """tokens, and at the positions in `tops` their top logprobs ({token: logprob})."""
    positions = [
        Position([Top(t, v) for t, v in tops.get(i, {}).items()]) for i in range(len(tokens))
    ]
    return Reply(tokens, positions)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_equal_replies_pass_without_logprobs():
    assert not assert_same_reply_up_to_a_near_tie(Reply([1, 2, 3]), Reply([1, 2, 3]))


def test_a_near_tie_may_part_the_replies_and_what_follows_is_not_compared():
    tie = NEAR_TIE_NATS / 2
    got = reply([1, 7, 9, 9], {1: {7: -0.70, 8: -0.70 - tie}})
    expected = reply([1, 8, 4, 4], {1: {8: -0.69, 7: -0.69 - tie}})
    assert assert_same_reply_up_to_a_near_tie(got, expected)


@pytest.mark.parametrize(
    "got_tops, expected_tops, why",
    [
        ({7: -0.1, 8: -2.5}, {8: -0.1, 7: -2.5}, "not a near tie"),
        ({7: -0.1, 5: -0.12}, {8: -0.1, 7: -0.11}, "not a tie"),  # 8 not among got's top
    ],
)
def test_a_clear_difference_fails(got_tops, expected_tops, why):
    got = reply([1, 7, 9], {1: got_tops})
    expected = reply([1, 8, 4], {1: expected_tops})
    with pytest.raises(AssertionError, match=why):
        assert_same_reply_up_to_a_near_tie(got, expected)


def test_a_shorter_reply_fails():
    with pytest.raises(AssertionError, match="lengths differ"):
        assert_same_reply_up_to_a_near_tie(Reply([1, 2]), Reply([1, 2, 3]))


def test_a_difference_without_logprobs_fails():
    with pytest.raises(AssertionError, match="no logprobs"):
        assert_same_reply_up_to_a_near_tie(Reply([1, 2, 3]), Reply([1, 5, 3]))
