"""The core's token stops (StopChecker), in isolation."""

from __future__ import annotations

import pytest

from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.token_stops import StopChecker

from .harness import EOS, make_request


def _checker(max_model_len=100, **sampling) -> tuple[StopChecker, object]:
    request = make_request(prompt=10, **sampling)
    return StopChecker(request.sampling, (EOS,), max_model_len), request


def _check(checker, request, token_id):
    request.output_token_ids.append(token_id)
    return checker.check(token_id, request.num_output_tokens, request.num_prompt_tokens)


@pytest.mark.parametrize(
    ("sampling", "token_id", "expected"),
    [
        ({}, EOS, FinishReason.STOP),
        ({"ignore_eos": True}, EOS, None),
        ({"stop_token_ids": (7,)}, 7, FinishReason.STOP),
        ({"stop_token_ids": (7,), "ignore_eos": True}, 7, FinishReason.STOP),
        ({}, 7, None),
        ({"max_tokens": 1}, 7, FinishReason.LENGTH),
        # A natural stop on the last allowed token is a STOP, not a LENGTH.
        ({"max_tokens": 1}, EOS, FinishReason.STOP),
    ],
)
def test_token_rules(sampling, token_id, expected):
    checker, request = _checker(**sampling)
    assert _check(checker, request, token_id) is expected


def test_model_length_ends_with_length():
    checker, request = _checker(max_model_len=12, max_tokens=50)
    assert _check(checker, request, 5) is None
    assert _check(checker, request, 5) is FinishReason.LENGTH


def test_min_tokens_delays_eos_and_stop_ids_but_not_max_tokens():
    checker, request = _checker(min_tokens=2, max_tokens=4, stop_token_ids=(7,))
    assert not checker.stops_active(2)
    assert checker.stops_active(3)
    assert _check(checker, request, EOS) is None
    assert _check(checker, request, 7) is None
    assert _check(checker, request, EOS) is FinishReason.STOP
    checker, request = _checker(min_tokens=2, max_tokens=2)
    assert _check(checker, request, 5) is None
    assert _check(checker, request, 5) is FinishReason.LENGTH
