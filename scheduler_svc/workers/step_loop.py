"""One worker's iterations: schedule(), run on the worker, postprocess (nano-vllm's
three verbs), with the worker never waiting for the scheduler.

With async scheduling (SchedulerConfig.max_steps_in_flight == 2) the loop builds and
sends plan N+1 before it reads the result of plan N, which the worker is running:
the worker finds its next step waiting when it answers, and the scheduler's own work
(reading the result, detokenizing, streaming, planning) overlaps the forward. See
core/scheduler.py for what that asks of the bookkeeping. The deferred masks of the
plan in flight (constrained rows planned ahead of their sample) go out right after
the result before it is applied: the worker's sampler waits for them. With one plan
in flight it is the plain loop: schedule, step, postprocess.

The loop ends only by WorkerLost (the stream broke, a step missed its deadline, or
the worker answered out of protocol); the engine recovers and starts a new one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.cancel_safe import set_within
from scheduler_svc.config.faults import FaultConfig
from scheduler_svc.core.plan import StepPlan
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.workers.client import WorkerClient, WorkerLost
from scheduler_svc.workers.handle import RequestHandles
from scheduler_svc.workers.liveness import LossCause

if TYPE_CHECKING:
    from scheduler_svc.metrics import SchedulerMetrics


@dataclass
class _SentStep:
    plan: StepPlan
    answer: asyncio.Future  # completed by the client's stream reader
    sent_at: float


class StepLoop:
    def __init__(
        self,
        client: WorkerClient,
        handles: RequestHandles,
        faults: FaultConfig,
        metrics: SchedulerMetrics | None,
        on_step: Callable[[], None],
        on_schedule: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.handles = handles
        self.faults = faults
        self.metrics = metrics
        self._on_step = on_step
        # After every schedule(): the engine starts the LoRA loads it asks for.
        self._on_schedule = on_schedule
        # Set when a request arrives or leaves, or the worker is lost: wakes an idle loop.
        self.wakeup = asyncio.Event()

    async def run(self, scheduler: Scheduler) -> None:
        """Steps while the worker answers; raises WorkerLost when it is lost."""
        in_flight: deque[_SentStep] = deque()
        last_answer_at = time.monotonic()
        while True:
            self.client.raise_if_lost()
            if len(in_flight) < scheduler.max_in_flight:
                plan = scheduler.schedule()
                self._on_schedule()
                self.handles.deliver_failures(scheduler.take_failed())
                if plan is not None:
                    self._note_first_scheduled(plan, scheduler)
                    if plan.deferred_mask_seq_ids:
                        plan.deferred_mask_timeout_s = self.faults.deferred_mask_timeout_s
                    sent_at = time.monotonic()
                    in_flight.append(_SentStep(plan, await self.client.send(plan), sent_at))
                    continue  # plan the next one while this one runs
            if not in_flight:
                self.wakeup.clear()
                await self._sleep_until_woken_or(_next_deadline(scheduler))
                continue
            sent = in_flight.popleft()
            deadline_s = self.faults.step_deadline_s(sent.plan.num_scheduled_tokens)
            result = await self.client.result(sent.plan, sent.answer, deadline_s)
            answered_at = time.monotonic()
            try:
                outputs = scheduler.update_from_output(sent.plan, result)
            except RuntimeError as error:
                # The worker broke the protocol: its state cannot be trusted.
                raise WorkerLost(f"protocol error: {error}", LossCause.PROTOCOL) from error
            # The next plan's sampler may be waiting for these: before anything else.
            masks = scheduler.take_deferred_masks()
            if masks is not None:
                await self.client.send_masks(masks)
            self._on_step()
            if scheduler.speculation is not None:
                scheduler.speculation.acceptance_log.maybe_log(answered_at)
            for output in outputs:
                self.handles.deliver(output)
            self.handles.deliver_failures(scheduler.take_failed())
            if self.metrics is not None:
                # The step's own time starts when the worker could start it: when it was
                # sent, or when the step before it answered, whichever is later.
                step_s = answered_at - max(sent.sent_at, last_answer_at)
                total_s = time.monotonic() - last_answer_at
                self.metrics.observe_iteration(
                    self.client.address, step_s, result.forward_seconds, total_s
                )
            last_answer_at = answered_at

    def _note_first_scheduled(self, plan: StepPlan, scheduler: Scheduler) -> None:
        if not plan.new_sequences:
            return
        # A preempted request comes back as a new sequence: keep the first time.
        now = time.monotonic()
        new_seq_ids = {sequence.seq_id for sequence in plan.new_sequences}
        for request in scheduler.running:
            handle = self.handles.get(request.request_id)
            if request.seq_id in new_seq_ids and handle and handle.first_scheduled is None:
                handle.first_scheduled = now

    async def _sleep_until_woken_or(self, deadline: float | None) -> None:
        """Idle until a request arrives or leaves, or a queued request's deadline passes."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        # Not wait_for, which on Python 3.10 and 3.11 can lose the engine's cancel.
        await set_within(self.wakeup, timeout)


def _next_deadline(scheduler: Scheduler) -> float | None:
    deadlines = [
        request.deadline
        for request in (*scheduler.waiting, *scheduler.running)
        if request.deadline is not None
    ]
    return min(deadlines, default=None)
