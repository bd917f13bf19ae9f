"""Handing a scheduler's requests to another one when its worker is lost.

take_unfinished empties a scheduler of what it was running or queueing; adopt
queues such a request on another scheduler, which prefills it over its prompt
plus output so far. Part of Scheduler (a mixin): it works on the same queues,
block tables and output processors.
"""

from __future__ import annotations

from scheduler_svc.core.request import Request, RequestStatus
from scheduler_svc.output.output_processor import RequestOutputProcessor


class HandoverMixin:
    def take_unfinished(self) -> list[tuple[Request, RequestOutputProcessor]]:
        """Empties the scheduler of its unfinished requests, for another worker to resume.

        Called when the worker is lost: whatever it held (KV, a step in flight)
        is gone. Each request comes back as a resumed one, WAITING with nothing
        computed and unseen by any worker, with its output so far and the
        processor that holds its detokenizer and stop state; `adopt` on another
        scheduler prefills it over prompt + output and it goes on where it
        stopped. In arrival order (priority first), as they were queued.
        """
        requests = sorted(
            [*self.running, *self.waiting], key=lambda r: (r.priority, r.arrival_time, r.seq_id)
        )
        taken = []
        for request in requests:
            self.queue.remove(request)
            if self.block_manager.has_blocks(request.seq_id):
                self.block_manager.free(request.seq_id)
            request.status = RequestStatus.WAITING
            request.num_computed_tokens = 0
            request.seen_by_worker = False
            request.sampled_since_admission = False
            request.num_bypassed = 0
            del self._requests[request.request_id]
            taken.append((request, self._processors.pop(request.request_id)))
        # The worker is gone: nothing to tell it, and its step will never answer.
        self._finished_seq_ids.clear()
        self._step_in_flight = None
        return taken

    def adopt(self, request: Request, processor: RequestOutputProcessor) -> None:
        """Queues a request taken from another scheduler (take_unfinished) with its processor.

        Raises ValueError for a request that is not in the state take_unfinished
        leaves, or whose tokens this worker could never hold.
        """
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if (
            request.status is not RequestStatus.WAITING
            or request.num_computed_tokens
            or request.seen_by_worker
        ):
            raise ValueError(f"request {request.request_id!r} is not a waiting request")
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_tokens} tokens; this "
                f"worker's max_model_len is {self.max_model_len}"
            )
        self._requests[request.request_id] = request
        self._processors[request.request_id] = processor
        self.queue.add_waiting(request)
