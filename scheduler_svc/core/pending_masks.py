"""Deferred masks in the scheduler: the plans in flight that still owe their worker
the mask rows of some constrained sequences.

Under async scheduling a constrained request is planned while its previous sample is
in flight, as every other request is; its allowed tokens depend on that sample, so
the plan only lists it (StepPlan.deferred_mask_seq_ids) and the worker runs the
forward without the row, its sampler waiting for it. When every plan before that one
has answered, the request has taken all its tokens but the one this plan samples:
`take` then builds the rows (structured/scheduling.py) and the step loop sends them
at once. That is vLLM's deferred sample_tokens and SGLang's overlap scheduler, with
the mask travelling because here the grammar is the scheduler's and the sampler the
worker's.

A row that never reaches the sampler (a lost or late message, a row left out) comes
back in StepResult.mask_missing_seq_ids; its token was sampled without the grammar,
so the request fails and that token is never taken (`missing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler_svc.core.plan import DeferredMasks, StepOutput, StepPlan
from scheduler_svc.structured.scheduling import deferred_masks

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request


class PendingMasks:
    def __init__(self) -> None:
        # By step id: each deferred row's request, its num_preemptions when planned and
        # the drafts it may verify; and the plan's n-gram lookup (for those drafts).
        self._by_step: dict[int, tuple[list[tuple[Request, int, int]], tuple | None]] = {}

    def note(self, plan: StepPlan, planned: Sequence[tuple[Request, int, bool, int]]) -> None:
        """Records a plan just made, if it defers rows."""
        if plan.deferred_mask_seq_ids:
            deferred = set(plan.deferred_mask_seq_ids)
            rows = [
                (request, planned_at, drafts)
                for request, planned_at, _, drafts in planned
                if request.seq_id in deferred
            ]
            self._by_step[plan.step_id] = (rows, plan.ngram_lookup)

    def take(self, oldest_step_id: int | None) -> DeferredMasks | None:
        """The rows of the oldest plan in flight (every plan before it has answered),
        once; None if it defers none or they were taken already."""
        noted = self._by_step.pop(oldest_step_id, None)
        if noted is None:
            return None
        deferred, lookup = noted
        num_words = deferred[0][0].structured.num_words
        return deferred_masks(oldest_step_id, deferred, num_words, lookup)

    def missing(self, plan: StepPlan, result: StepOutput) -> set[int]:
        """The plan's rows that sampled without their mask; raises RuntimeError for a
        row the plan never deferred (a worker out of protocol). Forgets the plan."""
        self._by_step.pop(plan.step_id, None)
        missing = set(result.mask_missing_seq_ids)
        if not missing <= set(plan.deferred_mask_seq_ids):
            raise RuntimeError(
                f"step {result.step_id}: masks missing for {sorted(missing)}, but only "
                f"{plan.deferred_mask_seq_ids} were deferred"
            )
        return missing

    def clear(self) -> None:
        """The worker is lost: no plan in flight will ever sample."""
        self._by_step.clear()
