"""The per-step plan: which sequences compute how many tokens, in which KV blocks.

One Scheduler per worker. Each step, `schedule()` fills a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`) in three passes:

1. Priority: a waiting request of strictly better priority than some running
   ones, that does not fit, preempts the fewest of them (worst first) that
   makes it fit and is admitted; if even all of them would not, none is.
2. Running requests, best first (priority, then arrival): one decode token
   each or their next prefill chunk (chunked prefill, so decodes keep flowing
   beside a long prompt). A request that needs a block when none is free
   preempts the worst running request that may be preempted, possibly itself.
3. Waiting requests, best first, while the budget and the cap allow (see
   AdmissionQueue in admission.py for the order and the no-starvation rule).

The plan is a diff (vLLM's SchedulerOutput idea): a sequence the worker has
not seen carries its tokens, sampling settings and block table; one it holds
carries only how many tokens to compute and its new blocks.
`update_from_output()` then appends the sampled tokens, detokenizes, checks
stops, registers newly full blocks in the prefix cache and frees what finished.

Preemption (by recompute) and its bounds: see admission.py. With
num_scheduler_steps > 1, a step of decodes only may cover several decode
steps: see multi_step.py.

The engine alternates `schedule()` and `update_from_output()`: one step in
flight at a time. `add_request` and `abort_request` may come at any moment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.admission import AdmissionQueue
from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.handover import HandoverMixin
from scheduler_svc.core.multi_step import MultiStepMixin
from scheduler_svc.core.plan import (
    ContinuingSequence,
    NewSequence,
    StepOutput,
    StepPlan,
    match_output,
)
from scheduler_svc.core.request import (
    FinishReason,
    Request,
    RequestError,
    RequestOutput,
    RequestStatus,
)
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.output.detokenizer import Decoder
from scheduler_svc.output.output_processor import RequestOutputProcessor


class Scheduler(HandoverMixin, MultiStepMixin):
    def __init__(
        self,
        config: SchedulerConfig,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        tokenizer: Decoder,
        eos_token_ids: Sequence[int],
        stats: SchedulerStats | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.config = config
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, block_size, config.enable_prefix_caching)
        self.stats = stats if stats is not None else SchedulerStats()
        self._clock = clock
        self._tokenizer = tokenizer
        self._eos_token_ids = tuple(eos_token_ids)
        self.queue = AdmissionQueue(config, self.block_manager, self.stats)
        # Unfinished requests, for abort by id, with their output processors.
        self._requests: dict[str, Request] = {}
        self._processors: dict[str, RequestOutputProcessor] = {}
        # Sequences the worker must drop, sent with the next plan.
        self._finished_seq_ids: list[int] = []
        # Requests the scheduler ended with an error, until the engine takes them.
        self._failed: list[Request] = []
        self._next_step_id = 1
        self._step_in_flight: int | None = None

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
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if request.status is not RequestStatus.WAITING or request.num_output_tokens:
            raise ValueError(f"request {request.request_id!r} is not a fresh request")
        if not 0 < request.num_prompt_tokens < self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: a prompt must have 1 to "
                f"{self.max_model_len - 1} tokens, got {request.num_prompt_tokens}"
            )
        needed = self.block_manager.blocks_needed(request.num_prompt_tokens)
        if needed > self.block_manager.num_blocks:
            raise ValueError(
                f"request {request.request_id!r}: its prompt needs {needed} KV blocks, "
                f"the pool has {self.block_manager.num_blocks}"
            )
        self._requests[request.request_id] = request
        self._processors[request.request_id] = RequestOutputProcessor(
            request, self._tokenizer, self._eos_token_ids, self.max_model_len
        )
        self.queue.add_waiting(request)

    def abort_request(self, request_id: str) -> None:
        """Drops a request wherever it is; a no-op for unknown or finished ids.

        If its step is in flight, the token that step samples for it is ignored.
        """
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)

    def take_failed(self) -> list[Request]:
        """Requests the scheduler ended with an error (request.error) since the last call."""
        failed, self._failed = self._failed, []
        return failed

    def schedule(self) -> StepPlan | None:
        """The next step's plan; None when there is nothing to compute or tell the worker."""
        if self._step_in_flight is not None:
            raise RuntimeError(
                f"step {self._step_in_flight} is still in flight: call update_from_output first"
            )
        self._expire_deadlines()
        plan = StepPlan(step_id=self._next_step_id)
        budget = self.config.max_num_batched_tokens
        step = self.queue.begin_step()
        if self.config.batching == "continuous":
            self.queue.admit_by_priority(step)
        for request in self.queue.running_in_order():
            if budget == 0:
                break
            num_scheduled = min(request.num_tokens - request.num_computed_tokens, budget)
            end = request.num_computed_tokens + num_scheduled
            if not self.queue.make_room(request, end, step):
                continue  # preempted, or failed because it can never fit
            self._add_to_plan(request, num_scheduled, plan)
            budget -= num_scheduled
        # Continuous batching admits only what this step can start; static
        # batching admits its whole batch at once and prefills it over the
        # next steps.
        static = self.config.batching == "static"
        if budget > 0 or static:
            for request in self.queue.admit_waiting(step):
                if budget > 0:
                    num_scheduled = min(request.num_tokens - request.num_computed_tokens, budget)
                    self._add_to_plan(request, num_scheduled, plan)
                    budget -= num_scheduled
                if budget == 0 and not static:
                    break
        for request in step.failed:
            self._fail(request, request.error)
        for request in step.preempted:
            if request.seen_by_worker:
                self._finished_seq_ids.append(request.seq_id)
                request.seen_by_worker = False
        plan.finished_seq_ids.extend(self._finished_seq_ids)
        self._finished_seq_ids.clear()
        self._plan_decode_steps(plan)
        if plan.is_empty:
            return None
        self._next_step_id += 1
        self._step_in_flight = plan.step_id
        return plan

    def _add_to_plan(self, request: Request, num_scheduled: int, plan: StepPlan) -> None:
        end = request.num_computed_tokens + num_scheduled
        # Cannot fail: make_room or admission secured the blocks.
        new_block_ids = self.block_manager.append_slots(request.seq_id, end)
        if request.seen_by_worker:
            plan.continuing_sequences.append(
                ContinuingSequence(request.seq_id, num_scheduled, list(new_block_ids))
            )
            return
        plan.new_sequences.append(
            NewSequence(
                seq_id=request.seq_id,
                prompt_token_ids=list(request.prompt_token_ids),
                output_token_ids=list(request.output_token_ids),
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=num_scheduled,
                block_ids=list(self.block_manager.block_table(request.seq_id)),
                sampling=request.sampling,
                min_tokens_banned_ids=list(
                    request.sampling.banned_until_min_tokens(self._eos_token_ids)
                ),
            )
        )
        request.seen_by_worker = True

    def _expire_deadlines(self) -> None:
        now = self._clock()
        for request in [*self.waiting, *self.running]:
            if request.deadline is not None and request.deadline <= now:
                where = "waiting" if request.status is RequestStatus.WAITING else "running"
                self._fail(
                    request,
                    RequestError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"deadline exceeded while {where} after "
                        f"{request.num_output_tokens} generated tokens",
                    ),
                )

    def update_from_output(self, plan: StepPlan, result: StepOutput) -> list[RequestOutput]:
        """Applies a step's result; returns one output per request that got a token."""
        if plan.step_id != self._step_in_flight or result.step_id != plan.step_id:
            raise RuntimeError(
                f"result for step {result.step_id} and plan {plan.step_id} do not match "
                f"the step in flight ({self._step_in_flight})"
            )
        self._step_in_flight = None
        scheduled, sampled = match_output(plan, result)
        running_by_seq_id = {request.seq_id: request for request in self.running}
        outputs = []
        for seq_id, num_scheduled in scheduled:
            request = running_by_seq_id.get(seq_id)
            if request is None:
                continue  # aborted while its step was in flight
            request.num_computed_tokens += num_scheduled
            self.block_manager.cache_computed_blocks(request)
            indices = sampled.get(seq_id)
            if (indices is not None) != (request.num_computed_tokens == request.num_tokens):
                raise RuntimeError(
                    f"step {result.step_id}: sequence {seq_id} must sample exactly when its "
                    f"scheduled tokens reach its end ({request.num_computed_tokens} of "
                    f"{request.num_tokens} computed, sampled: {indices is not None})"
                )
            if indices is None:
                continue  # a prefill chunk that is not the last
            outputs.append(self._take_tokens(request, indices, result))
        return outputs

    def _fail(self, request: Request, error: RequestError) -> None:
        request.error = error
        self._finish(request, FinishReason.ABORT)
        self._failed.append(request)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        """Takes a request out of the queues, frees its blocks, tells the worker."""
        self.queue.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if self.block_manager.has_blocks(request.seq_id):
            # Safe even if its step is in flight: the next plan drops the sequence
            # before any other sequence can be given these blocks.
            self.block_manager.free(request.seq_id)
        if request.seen_by_worker:
            self._finished_seq_ids.append(request.seq_id)
        del self._requests[request.request_id]
        del self._processors[request.request_id]
