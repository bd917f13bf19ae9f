"""The per-step plan: which sequences compute how many tokens, in which KV blocks.

One Scheduler per worker. Each step, `schedule()` fills a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`): running
requests first, one decode token each or their next prefill chunk, then
waiting requests in arrival order. A prompt longer than what is left of the
budget is split over several steps (chunked prefill), so decodes keep flowing
beside it, and one step may mix prefill chunks and decodes. The plan is a diff
(vLLM's SchedulerOutput idea): a sequence the worker has not seen carries its
tokens, sampling settings and block table; one it holds carries only how many
tokens to compute and its new blocks. `update_from_output()` then appends the
sampled tokens, detokenizes, checks stops and frees what finished.

There is no preemption yet, so KV must never run out in the middle of a
request: a waiting request is admitted only when the blocks for its whole
life fit beside the blocks the running requests may still claim (see
`_can_admit`). Blocks are still allocated lazily, as tokens are scheduled.
Admission is strictly first come, first served: a head request that does not
fit waits, and so does everything behind it (head-of-line blocking). The
preemption-by-recompute issue replaces `_can_admit` and lifts that.

The engine alternates `schedule()` and `update_from_output()`: one step in
flight at a time. `add_request` and `abort_request` may come at any moment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from cbserve.worker.v1 import worker_pb2 as wpb
from scheduler_svc.block_manager import BlockManager
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.detokenizer import Decoder
from scheduler_svc.output_processor import RequestOutputProcessor
from scheduler_svc.request import (
    FinishReason,
    Request,
    RequestOutput,
    RequestStatus,
    TokenLogprob,
)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        tokenizer: Decoder,
        eos_token_ids: Sequence[int],
    ) -> None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.config = config
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, block_size)
        self._tokenizer = tokenizer
        self._eos_token_ids = tuple(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Unfinished requests, for abort by id, with their output processors.
        self._requests: dict[str, Request] = {}
        self._processors: dict[str, RequestOutputProcessor] = {}
        # Sequences the worker must drop, sent with the next plan.
        self._finished_seq_ids: list[int] = []
        self._next_step_id = 1
        self._step_in_flight: int | None = None

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
        needed = self.block_manager.blocks_needed(self._max_kv_tokens(request))
        if needed > self.block_manager.num_blocks:
            raise ValueError(
                f"request {request.request_id!r} needs {needed} KV blocks, "
                f"the pool has {self.block_manager.num_blocks}"
            )
        self._requests[request.request_id] = request
        self._processors[request.request_id] = RequestOutputProcessor(
            request, self._tokenizer, self._eos_token_ids, self.max_model_len
        )
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> None:
        """Drops a request wherever it is; a no-op for unknown or finished ids.

        If its step is in flight, the token that step samples for it is ignored.
        """
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)

    def schedule(self) -> wpb.StepPlan | None:
        """The next step's plan; None when there is nothing to compute or tell the worker."""
        if self._step_in_flight is not None:
            raise RuntimeError(
                f"step {self._step_in_flight} is still in flight: call update_from_output first"
            )
        plan = wpb.StepPlan(step_id=self._next_step_id)
        budget = self.config.max_num_batched_tokens
        for request in self.running:
            if budget == 0:
                break
            budget -= self._schedule_tokens(request, budget, plan)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_seqs:
            request = self.waiting[0]
            if not self._can_admit(request):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            budget -= self._schedule_tokens(request, budget, plan)
        plan.finished_seq_ids.extend(self._finished_seq_ids)
        self._finished_seq_ids.clear()
        if not (plan.new_sequences or plan.continuing_sequences or plan.finished_seq_ids):
            return None
        self._next_step_id += 1
        self._step_in_flight = plan.step_id
        return plan

    def _schedule_tokens(self, request: Request, budget: int, plan: wpb.StepPlan) -> int:
        """Puts the request's next tokens (up to budget) into the plan; returns how many."""
        num_scheduled = min(request.num_tokens - request.num_computed_tokens, budget)
        end = request.num_computed_tokens + num_scheduled
        # Cannot fail: _can_admit reserved every block a running request may need.
        if self.block_manager.has_blocks(request.seq_id):
            new_block_ids = self.block_manager.append_slots(request.seq_id, end)
        else:
            new_block_ids = self.block_manager.allocate(request.seq_id, end)
        if request.seen_by_worker:
            plan.continuing_sequences.add(
                seq_id=request.seq_id,
                num_scheduled_tokens=num_scheduled,
                new_block_ids=new_block_ids,
            )
        else:
            plan.new_sequences.add(
                seq_id=request.seq_id,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=request.output_token_ids,
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=num_scheduled,
                block_ids=self.block_manager.block_table(request.seq_id),
                sampling=request.sampling.to_worker_proto(self._eos_token_ids),
            )
            request.seen_by_worker = True
        return num_scheduled

    def _can_admit(self, request: Request) -> bool:
        """The admission rule while nothing can be preempted: a reservation.

        A request is admitted only if every block it could ever need fits in the
        free blocks minus those the running requests may still claim (up to their
        own worst case: prompt plus max_tokens, within the model length). So a
        running request can always get its next block and the pool never
        deadlocks, at the price of admitting fewer requests than would usually fit.
        """
        reserved = sum(
            self.block_manager.num_missing_blocks(running.seq_id, self._max_kv_tokens(running))
            for running in self.running
        )
        needed = self.block_manager.num_missing_blocks(request.seq_id, self._max_kv_tokens(request))
        return needed <= self.block_manager.num_free_blocks - reserved

    def _max_kv_tokens(self, request: Request) -> int:
        # The last sampled token ends the request before anyone computes its KV.
        return min(request.num_prompt_tokens + request.sampling.max_tokens, self.max_model_len) - 1

    def update_from_output(self, plan: wpb.StepPlan, result: wpb.StepResult) -> list[RequestOutput]:
        """Applies a step's result; returns one output per request that got a token."""
        if plan.step_id != self._step_in_flight or result.step_id != plan.step_id:
            raise RuntimeError(
                f"result for step {result.step_id} and plan {plan.step_id} do not match "
                f"the step in flight ({self._step_in_flight})"
            )
        self._step_in_flight = None
        if len(result.token_ids) != len(result.seq_ids):
            raise RuntimeError(
                f"step {result.step_id}: {len(result.seq_ids)} sequence ids but "
                f"{len(result.token_ids)} token ids"
            )
        sampled_index = {seq_id: index for index, seq_id in enumerate(result.seq_ids)}
        logprobs_by_index = {entry.index: entry for entry in result.logprobs}
        scheduled = [(s.seq_id, s.num_scheduled_tokens) for s in plan.new_sequences]
        scheduled += [(s.seq_id, s.num_scheduled_tokens) for s in plan.continuing_sequences]
        unexpected = sampled_index.keys() - {seq_id for seq_id, _ in scheduled}
        if unexpected:
            raise RuntimeError(
                f"step {result.step_id}: tokens for unscheduled sequences {sorted(unexpected)}"
            )
        running_by_seq_id = {request.seq_id: request for request in self.running}
        outputs = []
        for seq_id, num_scheduled in scheduled:
            request = running_by_seq_id.get(seq_id)
            if request is None:
                continue  # aborted while its step was in flight
            request.num_computed_tokens += num_scheduled
            index = sampled_index.get(seq_id)
            if (index is not None) != (request.num_computed_tokens == request.num_tokens):
                raise RuntimeError(
                    f"step {result.step_id}: sequence {seq_id} must sample exactly when its "
                    f"scheduled tokens reach its end ({request.num_computed_tokens} of "
                    f"{request.num_tokens} computed, sampled: {index is not None})"
                )
            if index is None:
                continue  # a prefill chunk that is not the last
            token_id = result.token_ids[index]
            request.output_token_ids.append(token_id)
            logprob = self._token_logprob(request, token_id, logprobs_by_index.get(index))
            output = self._processors[request.request_id].process_token(request, logprob)
            if output.finish_reason is not None:
                self._finish(request, output.finish_reason)
            outputs.append(output)
        return outputs

    @staticmethod
    def _token_logprob(
        request: Request, token_id: int, entry: wpb.SampledLogprobs | None
    ) -> TokenLogprob | None:
        if entry is None or request.sampling.logprobs == 0:
            return None
        top = tuple(zip(entry.top_token_ids, entry.top_logprobs, strict=True))
        return TokenLogprob(token_id=token_id, logprob=entry.logprob, top=top)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        """Takes a request out of the queues, frees its blocks, tells the worker."""
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
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
