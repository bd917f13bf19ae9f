"""A scheduler's unfinished requests: how each enters, and how it leaves.

The planning (scheduler.py) asks what to compute; this table answers who is there
and keeps what each departure owes. A request enters once its scheduler has checked
it (a fresh one from the edge, or one handed over from a lost worker, handover.py),
with the token stop rules of this worker's model. It leaves finished (its tokens
ended it, the edge found a stop string, the client went away) or failed (deadline,
never fits); either way its blocks are freed at once and its sequence, if a worker
holds it, is named in the next plan for the worker to drop. Freeing while a step
that computes it is in flight is safe: the worker runs plans in order, so the drop
arrives before any other sequence can be given those blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grpc

from scheduler_svc.core.adapter_residency import AdapterResidency
from scheduler_svc.core.admission import AdmissionQueue
from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.deadlines import DeadlineHeap
from scheduler_svc.core.request import FinishReason, Request, RequestError, RequestStatus
from scheduler_svc.core.token_stops import StopChecker


class RequestTable:
    def __init__(
        self,
        queue: AdmissionQueue,
        block_manager: BlockManager,
        eos_token_ids: Sequence[int],
        max_model_len: int,
        adapters: AdapterResidency | None = None,
    ) -> None:
        self._queue = queue
        # The worker's LoRA slots: told of each adapter a request entering needs.
        self._adapters = adapters
        self._block_manager = block_manager
        self._eos_token_ids = tuple(eos_token_ids)
        self._max_model_len = max_model_len
        # Unfinished requests by id (abort comes by id), with their token stop rules.
        self._requests: dict[str, Request] = {}
        self._stop_checkers: dict[str, StopChecker] = {}
        self._deadlines = DeadlineHeap()
        # Sequences the worker must drop, sent with the next plan.
        self.finished_seq_ids: list[int] = []
        # Requests ended with an error, until the engine takes them.
        self._failed: list[Request] = []

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def stop_checker(self, request: Request) -> StopChecker:
        return self._stop_checkers[request.request_id]

    def add(self, request: Request) -> None:
        """Enters a fresh request from the edge; raises ValueError if it could never run
        on this worker."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if request.status is not RequestStatus.WAITING or request.num_output_tokens:
            raise ValueError(f"request {request.request_id!r} is not a fresh request")
        if not 0 < request.num_prompt_tokens < self._max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: a prompt must have 1 to "
                f"{self._max_model_len - 1} tokens, got {request.num_prompt_tokens}"
            )
        needed = self._block_manager.blocks_needed(request.num_prompt_tokens)
        if needed > self._block_manager.num_blocks:
            raise ValueError(
                f"request {request.request_id!r}: its prompt needs {needed} KV blocks, "
                f"the pool has {self._block_manager.num_blocks}"
            )
        self.enter(request)

    def enter(self, request: Request) -> None:
        """Tracks a checked request and queues it; its sampling settings get the ids the
        worker must not sample before min_tokens, which only a scheduler can work out:
        they name this model's EOS (the one home of SamplingParams.min_tokens_banned_ids)."""
        if request.adapter is not None and self._adapters is None:
            raise ValueError(f"request {request.request_id!r}: this worker serves no adapters")
        sampling = request.sampling
        banned = sampling.banned_until_min_tokens(self._eos_token_ids)
        if banned != sampling.min_tokens_banned_ids:
            request.sampling = dataclasses.replace(sampling, min_tokens_banned_ids=banned)
        self._requests[request.request_id] = request
        self._stop_checkers[request.request_id] = StopChecker(
            request.sampling, self._eos_token_ids, self._max_model_len
        )
        self._deadlines.push(request)
        if request.adapter is not None:
            self._adapters.want(request.adapter, evict=False)  # a prefetch into a free slot
        self._queue.add_waiting(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Takes a request out of the queues, frees its blocks, tells the worker."""
        self._queue.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self._free_blocks(request)
        if request.seen_by_worker:
            self.finished_seq_ids.append(request.seq_id)
        self._forget(request)

    def fail(self, request: Request, error: RequestError) -> None:
        request.error = error
        self.finish(request, FinishReason.ABORT)
        self._failed.append(request)

    def take_failed(self) -> list[Request]:
        """Requests ended with an error (request.error) since the last call."""
        failed, self._failed = self._failed, []
        return failed

    def expire_deadlines(self, now: float) -> None:
        for request in self._deadlines.pop_expired(now):
            if self._requests.get(request.request_id) is request:  # else it left already
                where = "waiting" if request.status is RequestStatus.WAITING else "running"
                self.fail(
                    request,
                    RequestError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"deadline exceeded while {where} after "
                        f"{request.num_output_tokens} generated tokens",
                    ),
                )

    def leave_unfinished(self, request: Request) -> None:
        """Takes a request out of the queues and the table without finishing it: its
        blocks are freed and the worker is not told (handover.py: the worker is gone)."""
        self._queue.remove(request)
        self._free_blocks(request)
        self._forget(request)

    def hand_off(self, request: Request) -> None:
        """Takes a request out of the queues and the table keeping its blocks, whose KV
        moves to another worker (parking.py frees them once it has); the worker is told
        to drop the sequence."""
        self._queue.remove(request)
        if request.seen_by_worker:
            self.finished_seq_ids.append(request.seq_id)
        self._forget(request)

    def _free_blocks(self, request: Request) -> None:
        if self._block_manager.has_blocks(request.seq_id):
            self._block_manager.free(request.seq_id)

    def _forget(self, request: Request) -> None:
        # Its deadline stays in the heap until it comes up, then is skipped (deadlines.py).
        del self._requests[request.request_id]
        del self._stop_checkers[request.request_id]
