"""Stop-string hold-back (StopStringMatcher, the edge's), in isolation."""

from __future__ import annotations

from scheduler_svc.output.stop_strings import StopStringMatcher


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
