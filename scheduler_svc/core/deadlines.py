"""Requests' deadlines, soonest first, for the scheduler to expire at each step.

A heap, not a pass over every request: a step at 512 running requests must not pay
for each one's deadline. A request that finished or moved stays in the heap until
its deadline comes up; the scheduler skips it then (it is no longer tracked).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from scheduler_svc.core.request import Request


class DeadlineHeap:
    def __init__(self) -> None:
        # (deadline, seq_id, request): seq_id breaks ties without comparing requests.
        self._heap: list[tuple[float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, request: Request) -> None:
        """Tracks a request's deadline; one without a deadline is ignored."""
        if request.deadline is not None:
            heapq.heappush(self._heap, (request.deadline, request.seq_id, request))

    def pop_expired(self, now: float) -> Iterator[Request]:
        """The requests whose deadline is at or before `now`, soonest first, removed."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]
