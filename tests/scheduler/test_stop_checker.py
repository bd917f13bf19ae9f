"""Token stops (StopChecker) and stop-string hold-back (StopStringMatcher), in isolation."""

from __future__ import annotations

import pytest

from scheduler_svc.core.request import FinishReason
from scheduler_svc.output.stop_checker import StopChecker, StopStringMatcher

from .harness import EOS, make_request


def _feed(matcher: StopStringMatcher, pieces, stops_active=True) -> tuple[list[str], bool]:
    released = []
    for piece in pieces:
        text, stopped = matcher.add_text(piece, stops_active)
        released.append(text)
        if stopped:
            return released, True
    return released, False


def test_without_stop_strings_text_passes_straight_through():
    assert _feed(StopStringMatcher(()), ["a", "b"]) == (["a", "b"], False)


def test_holds_back_only_what_may_still_become_a_stop_string():
    matcher = StopStringMatcher(["STOP"])
    # "hello" cannot start "STOP": nothing is held (a blanket hold-back would keep 3 chars).
    assert matcher.add_text("hello S", True) == ("hello ", False)
    assert matcher.add_text("T", True) == ("", False)
    # "STx" can no longer become "STOP": released at once.
    assert matcher.add_text("x", True) == ("STx", False)


def test_match_cuts_the_text_right_before_the_stop_string():
    released, stopped = _feed(StopStringMatcher(["STOP"]), ["a S", "T", "OP and more"])
    assert stopped
    assert "".join(released) == "a "


def test_match_inside_one_piece():
    assert _feed(StopStringMatcher(["\n\n"]), ["one\n\ntwo"]) == (["one"], True)


def test_held_text_overlapping_a_second_candidate():
    # "aab" + "c": the held "aab" is not "abc" but its tail "ab" + "c" is.
    released, stopped = _feed(StopStringMatcher(["abc"]), ["xaab", "c"])
    assert stopped
    assert "".join(released) == "xa"


def test_the_stop_string_that_completes_first_wins():
    # Arriving one character at a time, "cd" would complete before "abcde".
    released, stopped = _feed(StopStringMatcher(["abcde", "cd"]), ["ab", "cde"])
    assert stopped
    assert "".join(released) == "ab"
    # Equal ends: the longer one (it starts earlier).
    released, stopped = _feed(StopStringMatcher(["de", "bcde"]), ["a", "bcde"])
    assert stopped
    assert "".join(released) == "a"


def test_inactive_stops_let_a_complete_stop_string_through_but_still_hold_prefixes():
    matcher = StopStringMatcher(["ab"])
    assert matcher.add_text("xab", False) == ("xab", False)
    assert matcher.add_text("a", False) == ("", False)
    # Now active: "a" + "b" completes "ab" in the new text.
    assert matcher.add_text("b", True) == ("", True)


def test_flush_releases_held_text():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.add_text("end ST", True) == ("end ", False)
    assert matcher.flush() == "ST"
    assert matcher.flush() == ""


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
