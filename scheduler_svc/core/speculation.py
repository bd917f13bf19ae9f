"""Speculative decoding in the scheduler: how many drafts each decode may verify, and
the accounting when fewer are accepted.

The worker proposes the drafts (with async scheduling only it knows the token they
follow) and verifies them (worker_svc/speculation/); the scheduler owns the room:

- Planning. A decode given k drafts is counted as if all will be accepted: 1 + k
  tokens of the step's budget, KV blocks for 1 + k more tokens (taken from the free
  blocks only: drafts never preempt anyone), 1 + k pending samples. So the next plan,
  built while this one runs, needs no result, as for a plain decode.
- Taking the result. The worker emits m tokens (1 <= m <= 1 + k): the accepted drafts
  and the token after them. The other 1 + k - m are rolled back from the request's
  computed tokens and pending samples (`settle`); its blocks stay, and the stale KV
  slots past the accepted tokens are written again by later steps. The prefix cache
  only ever registers blocks whose tokens the request has taken, so a block holding a
  rejected draft's KV is never shared.

How many drafts (`draft_room`): a draft at position i pays when its chance of being
accepted beats what one more row costs. The chance is p^i, with p the request's own
acceptance rate so far (a decaying count, so that a request moving from copied text
to new text stops drafting soon). The cost is the share of a step's time one more row
takes at this batch: with a step of T rows taking a + b*T seconds and about n tokens
per step, one more row pays when p^i > c*n / (1 + c*n), c = b / a (StepCost, fitted
on this worker's decode steps). On a CPU at batch 1 c is small (the weights are read
once whatever the rows), so drafts pay even at modest acceptance; at batch 64 the
same row needs an acceptance near 1, which turns speculation off where vLLM's and
llama.cpp's regress. A request given no drafts drifts back to the prior, so it tries
again after a while. `--speculative-drafts fixed` gives every decode
num_speculative_tokens instead, as vLLM does.

Constrained requests follow the same rule, on a worker that reads a mask row per draft
position (WorkerDescription.accepts_constrained_drafts; structured/draft_masks.py).
"""

from __future__ import annotations

import math

import structlog

from scheduler_svc.config.speculative import SpeculativeConfig
from scheduler_svc.core.admission import AdmissionQueue
from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.draft_record import DraftRecord
from scheduler_svc.core.multi_step import room_to_sample
from scheduler_svc.core.plan import StepOutput, StepPlan
from scheduler_svc.core.request import Request
from scheduler_svc.core.speculation_stats import AcceptanceLog, DraftStats


class StepCost:
    """c = b / a for this worker's decode steps, a + b*T seconds for T rows: a weighted
    least-squares fit of (rows, seconds) over recent decode-only steps, each step's
    weight decaying so the fit follows the batch as it changes. Until the steps seen
    vary enough in their rows, the prior stands in: what the worker measured at start
    (WorkerDescription.draft_row_cost), else PRIOR_RATIO."""

    PRIOR_RATIO = 0.05
    # A measured 0 (a step with drafts no slower) is taken as this: never free.
    MIN_PRIOR = 0.005
    DECAY = 0.98
    MAX_RATIO = 10.0

    def __init__(self, prior: float = 0.0) -> None:
        self.prior = max(prior, self.MIN_PRIOR) if prior > 0 else self.PRIOR_RATIO
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0:
            return
        d = self.DECAY
        self._w = self._w * d + 1
        self._x = self._x * d + rows
        self._y = self._y * d + seconds
        self._xx = self._xx * d + rows * rows
        self._xy = self._xy * d + rows * seconds

    @property
    def ratio(self) -> float:
        if self._w < 8:
            return self.prior
        mean_x, mean_y = self._x / self._w, self._y / self._w
        variance = self._xx / self._w - mean_x * mean_x
        if variance < 0.25:  # the rows barely varied: the slope is not measured
            return self.prior
        slope = (self._xy / self._w - mean_x * mean_y) / variance
        intercept = mean_y - slope * mean_x
        if slope <= 0:
            return 0.0
        if intercept <= 0:
            return self.MAX_RATIO  # all cost scales with the rows: drafts cannot pay
        return min(slope / intercept, self.MAX_RATIO)


class Speculation:
    """The scheduler's side of speculative decoding for one worker."""

    def __init__(
        self,
        config: SpeculativeConfig,
        stats: DraftStats,
        queue: AdmissionQueue,
        drafts: str = "adaptive",
        row_cost: float = 0.0,
        constrained: bool = False,
    ):
        self.config = config
        # The worker reads a mask row per draft position (constrained rows may draft).
        self.constrained = constrained
        self.config_drafts = drafts  # SchedulerConfig.speculative_drafts
        self.stats = stats
        self.cost = StepCost(row_cost)
        self._queue = queue  # the batch size a draft's cost is weighed at
        self.acceptance_log = AcceptanceLog(
            stats, structlog.get_logger("scheduler.speculation"), lambda: self.cost.ratio
        )

    def plan_drafts(
        self, request: Request, budget: int, blocks: BlockManager, max_model_len: int
    ) -> int:
        """Drafts the next decode of a request the worker holds may verify in the plan
        being built: within `budget` tokens, the request's limits and the free blocks
        (drafts never preempt); 0 for anything but a decode."""
        if not request.seen_by_worker:
            return 0  # a new sequence: the worker has no token to draft after yet
        if request.num_computed_tokens + 1 != request.num_planned_tokens:
            return 0  # a prefill chunk, not a decode
        limit = min(budget, room_to_sample(request, max_model_len) - 1)
        drafts = self.draft_room(request, len(self._queue.running), limit)
        if drafts == 0 and request.draft_record is not None:
            request.draft_record.relax()
        end = request.num_computed_tokens + 1 + drafts
        if drafts and not blocks.can_append_slots(request.seq_id, end):
            return 0
        return drafts

    @property
    def ngram_lookup(self) -> tuple[int, int]:
        return self.config.prompt_lookup_min, self.config.prompt_lookup_max

    def observe_step(self, plan: StepPlan, result: StepOutput) -> None:
        """Feeds the cost fit with a decode-only step (drafts included): a prefill's
        rows cost more than a decode's, and would bend the line."""
        if plan.new_sequences or plan.num_steps > 1:
            return
        if any(sequence.num_scheduled_tokens != 1 for sequence in plan.continuing_sequences):
            return
        self.cost.observe(result.num_tokens, result.forward_seconds)

    def draft_room(self, request: Request, batch_tokens: int, limit: int) -> int:
        """Drafts this decode may verify (0 to min(limit, num_speculative_tokens)), at a
        step of about batch_tokens tokens."""
        if limit <= 0 or (request.structured is not None and not self.constrained):
            return 0
        if self.config_drafts == "fixed":
            return min(limit, self.config.num_speculative_tokens)
        record = request.draft_record
        p = record.acceptance if record is not None else DraftRecord().acceptance
        cost = self.cost.ratio * max(batch_tokens, 1)
        threshold = cost / (1 + cost)
        if p <= threshold:
            return 0
        # Position i (from 1) pays while p^i > threshold.
        best = limit if threshold <= 0 or p >= 1 else int(math.log(threshold) / math.log(p))
        return max(0, min(best, limit, self.config.num_speculative_tokens))

    def settle(
        self, request: Request, num_drafts_planned: int, num_tokens: int, num_verified: int
    ) -> None:
        """After a drafting decode's result: roll back what was not accepted and learn
        from it. num_tokens: the tokens the worker emitted for it; num_verified: the
        drafts it found and verified (0: no earlier n-gram matched)."""
        unconfirmed = 1 + num_drafts_planned - num_tokens
        request.num_computed_tokens -= unconfirmed
        request.num_pending_samples -= unconfirmed
        if num_verified:
            if request.draft_record is None:
                request.draft_record = DraftRecord()
            request.draft_record.observe(num_verified, num_tokens - 1)
            self.stats.add(num_verified, num_tokens - 1)
