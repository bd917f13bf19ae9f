"""What AdmissionQueue.make_room asks before it preempts: the worker's mover (issue 46's
rebalance, workers/rebalance.py), as a Protocol of its own so that the admission queue
depends on neither the move nor the rule that decides it (core/rebalance.py)."""

from __future__ import annotations

from typing import Protocol

from scheduler_svc.core.request import Request


class VictimMover(Protocol):
    """What AdmissionQueue.make_room asks before it preempts (workers/rebalance.py)."""

    def moving(self) -> bool:
        """Whether a request is being moved off this worker: its blocks come back soon."""
        ...

    def offer(self, request: Request) -> bool:
        """Takes the would-be victim to move it elsewhere (it is parked on return);
        False: preempt it as usual."""
        ...
