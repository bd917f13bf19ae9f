"""Placement as pure functions: which candidate a new or a moved request goes to."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.workers.placement import pick_for_new, pick_for_resume


@dataclass
class Candidate:
    name: str
    capacity_tokens: int = 1000
    load: int = 0
    num_waiting: int = 0
    num_submitted: int = 0
    cached_tokens: int = 0

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.capacity_tokens

    def cached_prefix_tokens(self, token_ids) -> int:
        return self.cached_tokens


def test_a_new_request_goes_to_the_longest_cached_prefix_before_the_least_loaded():
    cached = Candidate("cached", load=3, cached_tokens=32)
    idle = Candidate("idle")
    assert pick_for_new([idle, cached], [1] * 40, 100) is cached


def test_a_cached_prefix_does_not_count_on_a_worker_with_a_backlog():
    backlog = Candidate("backlog", load=3, num_waiting=2, cached_tokens=32)
    idle = Candidate("idle", load=1)
    assert pick_for_new([backlog, idle], [1] * 40, 100) is idle


def test_equal_workers_take_turns_by_how_many_they_were_given():
    a, b = Candidate("a", num_submitted=5), Candidate("b", num_submitted=4)
    assert pick_for_new([a, b], [1], 10) is b


def test_a_new_request_refused_when_nothing_is_connected_or_nothing_holds_it():
    with pytest.raises(ServiceError) as none:
        pick_for_new([], [1], 10)
    assert none.value.code is grpc.StatusCode.UNAVAILABLE and "no worker" in none.value.message
    with pytest.raises(ServiceError) as small:
        pick_for_new([Candidate("small", capacity_tokens=50)], [1], 100)
    assert "100 tokens" in small.value.message and "max_tokens" in small.value.message


def test_a_moved_request_goes_to_the_least_loaded_worker_that_holds_it_or_waits():
    big_busy = Candidate("big busy", capacity_tokens=500, load=4)
    big_idle = Candidate("big idle", capacity_tokens=500, load=1)
    small = Candidate("small", capacity_tokens=50)
    assert pick_for_resume([small, big_busy, big_idle], 200) is big_idle
    assert pick_for_resume([small], 200) is None
