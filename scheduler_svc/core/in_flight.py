"""The plans in flight: sent to the worker and not answered yet, oldest first.

Under async scheduling (scheduler.py's module doc, workers/step_loop.py) up to
`max_in_flight` plans are out at once, and the worker answers them in the order they
were sent. For each, this keeps what it asked of which request: a result is applied
only to a request still in the state the plan saw (a preemption since makes it
stale), and only to the plan it answers. It also numbers the plans and holds the
deferred mask rows each still owes its worker (pending_masks.py).
"""

from __future__ import annotations

from scheduler_svc.core.pending_masks import PendingMasks
from scheduler_svc.core.plan import DeferredMasks, StepOutput, StepPlan
from scheduler_svc.core.request import Request

# What a plan in flight asked of one request: the request, its num_preemptions when
# planned (a preemption since makes the result stale), whether it samples and the
# drafts it may verify.
Planned = tuple[Request, int, bool, int]


class PlansInFlight:
    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._plans: dict[int, list[Planned]] = {}
        self._next_step_id = 1
        self._pending_masks = PendingMasks()

    def __len__(self) -> int:
        return len(self._plans)

    def next_step_id(self) -> int:
        """The id of the plan about to be made; raises RuntimeError when there is no room
        for another plan until the oldest is answered."""
        if len(self._plans) >= self.max_in_flight:
            raise RuntimeError(
                f"{len(self._plans)} steps are in flight: call update_from_output first"
            )
        return self._next_step_id

    def sent(self, plan: StepPlan, planned: list[Planned]) -> None:
        """Records a plan going out (made with next_step_id) and what it asked of whom."""
        self._next_step_id += 1
        self._plans[plan.step_id] = planned
        self._pending_masks.note(plan, planned)

    def answered(self, plan: StepPlan, result: StepOutput) -> tuple[list[Planned], set[int]]:
        """Forgets the oldest plan, which `result` must answer; what it asked of whom, and
        the rows that sampled without their deferred mask (pending_masks.missing).
        Raises RuntimeError for a result or plan out of order."""
        oldest = next(iter(self._plans), None)
        if plan.step_id != oldest or result.step_id != plan.step_id:
            raise RuntimeError(
                f"result for step {result.step_id} and plan {plan.step_id} do not match "
                f"the oldest step in flight ({oldest})"
            )
        planned = self._plans.pop(plan.step_id)
        return planned, self._pending_masks.missing(plan, result)

    def last_sent(self) -> int:
        """The step id of the newest plan sent (0: none yet)."""
        return self._next_step_id - 1

    def answered_through(self, step_id: int) -> bool:
        """Whether every plan up to step_id has answered: none of them writes KV any more."""
        oldest = next(iter(self._plans), None)
        return oldest is None or oldest > step_id

    def includes(self, request: Request) -> bool:
        """Whether a plan in flight computes or samples for the request (a move waits
        until none does: parking.py)."""
        return any(planned[0] is request for plan in self._plans.values() for planned in plan)

    def take_deferred_masks(self) -> DeferredMasks | None:
        """The deferred rows of the oldest plan in flight, once (PendingMasks.take)."""
        return self._pending_masks.take(next(iter(self._plans), None))

    def clear(self) -> None:
        """The worker is lost: none of these plans will ever answer."""
        self._plans.clear()
        self._pending_masks.clear()
