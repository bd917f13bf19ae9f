"""The per-step plan: which sequences compute how many tokens, in which KV blocks.

One Scheduler per worker. Each step, `schedule()` fills a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`) in three passes:

1. Priority: a waiting request of strictly better priority than some running
   ones, that does not fit, preempts the fewest of them (worst first) that
   makes it fit and is admitted; if even all of them would not, none is.
2. Running requests, best first (priority, then arrival): one decode token
   each or their next prefill chunk (chunked prefill). A request that needs a
   block when none is free preempts the worst preemptible running request,
   possibly itself (admission.py: order, no starvation, preemption bounds).
3. Waiting requests, best first, while the budget and the cap allow.

The plan is a diff (vLLM's SchedulerOutput idea): a sequence the worker has
not seen carries its tokens, sampling settings and block table; one it holds
carries only how many tokens to compute and its new blocks.
`update_from_output()` appends the sampled tokens, checks the stops that tokens
alone decide (EOS, stop token ids, max_tokens, model length: token_stops.py),
registers newly full blocks in the prefix cache and frees what finished. Text (detokenizing, stop
strings) is the edge's (output/text_stream.py): nothing here costs per character.

Async scheduling: up to `max_in_flight` plans may be out at once (see
workers/step_loop.py; what each asked of whom: in_flight.py). What a plan
computes counts as computed when planned, and what it samples as pending
(Request.num_pending_samples): the next plan's decode computes that token
without its id, which the worker sampled itself. So stop checks lag one step: a
request that stopped at step N's token is in step N+1 already, and the token N+1
samples for it is dropped unseen. Its blocks are freed when N's result comes;
the worker runs plans in order, so a later owner of those blocks writes them
only after N+1. max_tokens and the model length never cost that extra step (a
request is not planned past them), and a decode ahead of its sample never
preempts. Results for a request preempted, aborted or finished since its plan
went out are dropped.

Elsewhere: num_scheduler_steps > 1 (multi_step.py); requests entering and leaving
(request_table.py); moving them off a lost worker (handover.py); how a step's tokens
are taken (token_intake.py); LoRA adapters, planned only once loaded and at most
max_loras a step (adapter_residency.py).

Structured outputs (scheduler_svc/structured): a constrained request's mask depends
on the token before. With no sample pending its row goes in the plan; ahead of one it
is planned where the worker accepts deferred masks, its row sent after the plan
(pending_masks.py), else it waits for its sample; never in a multi-step plan. Its
matcher is rebuilt from the output tokens if it ever disagrees (a recompute checks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from scheduler_svc.config.core import SchedulerConfig
from scheduler_svc.core import handover
from scheduler_svc.core.adapter_residency import AdapterResidency, StepAdapters
from scheduler_svc.core.admission import AdmissionQueue
from scheduler_svc.core.block_manager import BlockEvents, BlockManager
from scheduler_svc.core.in_flight import Planned, PlansInFlight
from scheduler_svc.core.multi_step import plan_decode_steps, room_to_sample
from scheduler_svc.core.plan import (
    DeferredMasks,
    StepOutput,
    StepPlan,
    match_output,
)
from scheduler_svc.core.plan_entry import add_to_plan
from scheduler_svc.core.prompt_logprobs import take_prompt_logprobs
from scheduler_svc.core.request import FinishReason, Request, RequestOutput, RequestStatus
from scheduler_svc.core.request_table import RequestTable
from scheduler_svc.core.speculation import Speculation
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.core.token_intake import take_output
from scheduler_svc.structured.scheduling import mask_missing_error


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        eos_token_ids: Sequence[int],
        stats: SchedulerStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_in_flight: int = 1,
        deferred_masks: bool = False,
        drafts: bool = False,
        draft_row_cost: float = 0.0,
        constrained_drafts: bool = False,
        kv_events: BlockEvents | None = None,
        adapters: AdapterResidency | None = None,
    ) -> None:
        """kv_events: told of blocks entering and leaving the prefix cache (KV events);
        adapters: the worker's LoRA slots (None: LoRA off, no request has an adapter)."""
        self.adapters = adapters
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        # Plans sent and not answered yet, oldest first, with what each asked of whom.
        self._in_flight = PlansInFlight(max_in_flight)
        self.config = config
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(
            num_blocks, block_size, config.enable_prefix_caching, events=kv_events
        )
        self.stats = stats if stats is not None else SchedulerStats()
        self._clock = clock
        self._eos_token_ids = tuple(eos_token_ids)
        self.queue = AdmissionQueue(config, self.block_manager, self.stats)
        self.requests = RequestTable(
            self.queue, self.block_manager, self._eos_token_ids, max_model_len, adapters
        )
        # Plan constrained rows ahead of their pending sample, their masks sent later
        # (the worker says whether it accepts that: WorkerDescription).
        self.deferred_masks = deferred_masks
        # Speculative decoding, where configured and the worker drafts (core/speculation.py).
        self.speculation = None
        if drafts and config.speculative is not None:
            self.speculation = Speculation(
                config.speculative,
                self.stats.drafts,
                self.queue,
                config.speculative_drafts,
                draft_row_cost,
                constrained_drafts,
            )

    @property
    def max_in_flight(self) -> int:
        return self._in_flight.max_in_flight

    @property
    def waiting(self) -> list[Request]:
        return self.queue.waiting

    @property
    def running(self) -> list[Request]:
        return self.queue.running

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        """Queues a validated request; raises ValueError if it could never run."""
        self.requests.add(request)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """Drops a request wherever it is; a no-op for unknown or finished ids. `reason`
        is STOP when the edge found a stop string in its text.

        If its step is in flight, the token that step samples for it is ignored.
        """
        request = self.requests.get(request_id)
        if request is not None:
            self.requests.finish(request, reason)

    def take_failed(self) -> list[Request]:
        """Requests the scheduler ended with an error (request.error) since the last call."""
        return self.requests.take_failed()

    def schedule(self) -> StepPlan | None:
        """The next step's plan; None when there is nothing to compute or tell the worker."""
        step_id = self._in_flight.next_step_id()
        self.requests.expire_deadlines(self._clock())
        plan = StepPlan(step_id=step_id)
        planned: list[Planned] = []
        budget = self.config.max_num_batched_tokens
        step = self.queue.begin_step()
        # At most max_loras adapters a step (adapter_residency.py); set for any adapter.
        loras = StepAdapters(self.adapters) if self.adapters is not None else None
        gate = loras.may_take if loras is not None else None
        if self.config.batching == "continuous":
            self.queue.admit_by_priority(step, gate)
        for seen, request in enumerate(self.queue.running_in_order(), start=1):
            if budget == 0:
                break
            if request.num_pending_samples and room_to_sample(request, self.max_model_len) <= 0:
                continue  # its last token is being sampled: it ends when that comes
            if request.structured and request.num_pending_samples and not self.deferred_masks:
                continue  # its next mask needs the token in flight (see the module doc)
            num_scheduled = min(request.num_planned_tokens - request.num_computed_tokens, budget)
            if num_scheduled == 0 or (request.adapter is not None and not loras.take(request)):
                continue
            end = request.num_computed_tokens + num_scheduled
            if self.block_manager.can_append_slots(request.seq_id, end):
                pass
            elif request.num_pending_samples:
                # A decode ahead of its sample (async) never preempts, as a multi-step
                # lookahead does not: it waits for its result, then competes as usual.
                continue
            elif not self.queue.make_room(request, end, step):
                continue  # preempted, or failed because it can never fit
            # Drafts take what the decodes after this one leave of the budget.
            later = max(self.num_running - seen, 0)
            drafts = 0
            if self.speculation is not None and num_scheduled == 1:
                drafts = self.speculation.plan_drafts(
                    request, budget - 1 - later, self.block_manager, self.max_model_len
                )
            self._plan(request, num_scheduled, plan, planned, drafts)
            budget -= num_scheduled + drafts
        # Continuous batching admits only what this step can start; static
        # batching admits its whole batch at once and prefills it over the
        # next steps.
        static = self.config.batching == "static"
        if budget > 0 or static:
            for request in self.queue.admit_waiting(step, gate):
                if request.adapter is not None:
                    loras.take(request)
                if budget > 0:
                    num_scheduled = min(request.num_tokens - request.num_computed_tokens, budget)
                    self._plan(request, num_scheduled, plan, planned)
                    budget -= num_scheduled
                if budget == 0 and not static:
                    break
        for request in step.failed:
            self.requests.fail(request, request.error)
        dropped = self.requests.finished_seq_ids
        for request in step.preempted:
            if request.seen_by_worker:
                dropped.append(request.seq_id)
                request.seen_by_worker = False
        plan.finished_seq_ids.extend(dropped)
        dropped.clear()
        if not self._in_flight:  # a lookahead over another plan's samples: never
            plan_decode_steps(
                plan,
                self.running,
                self.block_manager,
                self.config.num_scheduler_steps,
                self.max_model_len,
            )
        if loras is not None:
            self.adapters.touch(loras.ids)
        if plan.is_empty:
            return None
        if plan.allowed_tokens is not None:
            plan.allowed_tokens.fill()
        self._in_flight.sent(plan, planned)
        return plan

    def _plan(
        self, request: Request, num_scheduled: int, plan: StepPlan, planned: list, drafts: int = 0
    ) -> None:
        lookup = self.speculation.ngram_lookup if drafts else None
        slot = 0 if request.adapter is None else self.adapters.slot(request.adapter.lora_id)
        samples = add_to_plan(
            request, num_scheduled, plan, self.block_manager, drafts, lookup, slot
        )
        planned.append((request, request.num_preemptions, samples, drafts))

    def update_from_output(self, plan: StepPlan, result: StepOutput) -> list[RequestOutput]:
        """Applies the oldest plan in flight's result; returns one output per request that
        got a token (a multi-step plan's tokens of one request merged into one)."""
        planned, missing = self._in_flight.answered(plan, result)
        _, sampled = match_output(plan, result)
        verified = dict(zip(result.seq_ids, result.draft_counts, strict=False))
        if self.speculation is not None:
            self.speculation.observe_step(plan, result)
        outputs = []
        for request, planned_at, samples, drafts in planned:
            indices = sampled.get(request.seq_id)
            if (indices is not None) != samples:
                raise RuntimeError(
                    f"step {result.step_id}: sequence {request.seq_id} must sample exactly "
                    f"when its scheduled tokens reach its end (planned to sample: {samples})"
                )
            if indices is not None and len(indices) > 1 + drafts and plan.num_steps == 1:
                raise RuntimeError(
                    f"step {result.step_id}: {len(indices)} tokens for sequence "
                    f"{request.seq_id}, which had room for {1 + drafts}"
                )
            if request.status is not RequestStatus.RUNNING or (
                request.num_preemptions != planned_at
            ):
                continue  # finished, aborted or preempted since: its tokens are dropped
            if request.seq_id in missing:
                # Sampled without its grammar: that token must never be taken.
                self.requests.fail(request, mask_missing_error(plan.step_id))
                continue
            self.block_manager.cache_computed_blocks(request)
            take_prompt_logprobs(request, result)
            if indices is not None:
                output = take_output(request, indices, result, self.requests, self._eos_token_ids)
                if output is not None:
                    outputs.append(output)
            if drafts and request.status is RequestStatus.RUNNING:
                num_verified = verified.get(request.seq_id, 0)
                self.speculation.settle(request, drafts, len(indices), num_verified)
        return outputs

    def take_deferred_masks(self) -> DeferredMasks | None:
        """The deferred rows of the oldest plan in flight, once every plan before it has
        answered (call after each update_from_output); None if it has none, or they
        were taken already. The worker's sampler waits for them: send them at once."""
        return self._in_flight.take_deferred_masks()

    # -- handing requests to another scheduler when the worker is lost (handover.py) ----

    def take_unfinished(self) -> list[Request]:
        """Empties the scheduler of its unfinished requests, for another worker to resume
        (`adopt` there). Called when the worker is lost: its steps will never answer."""
        taken = handover.take_unfinished(self.queue, self.requests)
        self._in_flight.clear()
        return taken

    def adopt(self, request: Request) -> None:
        """Queues a request taken from another scheduler (take_unfinished); raises
        ValueError for a request not in the state take_unfinished leaves, or whose
        tokens this worker could never hold."""
        handover.check_adoptable(request, self.requests, self.max_model_len)
        self.requests.enter(request)
