"""The deadline heap the scheduler expires requests from."""

from __future__ import annotations

from scheduler_svc.core.deadlines import DeadlineHeap
from tests.scheduler.harness import make_request


def test_expired_requests_come_soonest_first_and_once():
    heap = DeadlineHeap()
    late, soon, none, tie = (
        make_request(deadline=9.0),
        make_request(deadline=2.0),
        make_request(),
        make_request(deadline=2.0),
    )
    for request in (late, soon, none, tie):
        heap.push(request)
    assert len(heap) == 3  # no deadline: not tracked
    assert list(heap.pop_expired(1.9)) == []
    assert list(heap.pop_expired(2.0)) == sorted([soon, tie], key=lambda r: r.seq_id)
    assert list(heap.pop_expired(5.0)) == []
    assert list(heap.pop_expired(9.5)) == [late]
    assert len(heap) == 0


def test_stopping_early_leaves_the_rest_in_the_heap():
    heap = DeadlineHeap()
    first, second = make_request(deadline=1.0), make_request(deadline=1.5)
    heap.push(first)
    heap.push(second)
    expired = heap.pop_expired(2.0)
    assert next(expired) is first
    assert len(heap) == 1  # a generator: nothing is popped before it is asked for
