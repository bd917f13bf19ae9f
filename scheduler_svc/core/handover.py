"""Handing a lost worker's requests to another worker's scheduler.

A worker that is lost (dead, hung, unreachable: workers/liveness.py) takes with it
everything it held: the KV of its sequences and the steps in flight. What it held is
recomputed, not lost, because the scheduler keeps every request's full token ids:
`take_unfinished` empties the lost worker's scheduler, and `adopt` queues each
request on another one, which prefills it over prompt + output so far; it goes on
where it stopped. The edge never learns of the move: its text state (detokenizer,
stop strings) follows the token ids, which do not change.

What a recompute must rebuild, it rebuilds from the token ids: a grammar's matcher
is rebuilt from the output tokens when it disagrees (structured/); prompt logprobs
already sent are not asked again (prompt_logprobs.py). The Scheduler methods of the
same names call these; its plans in flight on the lost worker are dropped there.
"""

from __future__ import annotations

from scheduler_svc.core.admission import AdmissionQueue
from scheduler_svc.core.request import Request, RequestStatus
from scheduler_svc.core.request_table import RequestTable


def take_unfinished(queue: AdmissionQueue, requests: RequestTable) -> list[Request]:
    """Every unfinished request, out of the queues and the table, ready for `adopt`.

    Each comes back WAITING with nothing computed or pending, unseen by any worker,
    with its output so far; in arrival order (priority first), as they were queued.
    """
    unfinished = sorted(
        [*queue.running, *queue.waiting], key=lambda r: (r.priority, r.arrival_time, r.seq_id)
    )
    for request in unfinished:
        requests.leave_unfinished(request)
        reset_for_recompute(request)
    # The worker is gone: nothing to tell it.
    requests.finished_seq_ids.clear()
    return unfinished


def reset_for_recompute(request: Request) -> None:
    """Leaves a request out of any scheduler in the state `adopt` takes: WAITING, nothing
    computed or pending, unseen by any worker, its output so far kept (also a move whose
    KV could not follow it: parking.py)."""
    request.status = RequestStatus.WAITING
    request.num_computed_tokens = 0
    request.num_pending_samples = 0
    request.seen_by_worker = False
    request.sampled_since_admission = False
    request.num_bypassed = 0


def check_adoptable(request: Request, requests: RequestTable, max_model_len: int) -> None:
    """Raises ValueError for a request not in the state take_unfinished leaves, or whose
    tokens a worker of max_model_len could never hold."""
    if request.request_id in requests:
        raise ValueError(f"request id {request.request_id!r} is already scheduled")
    if (
        request.status is not RequestStatus.WAITING
        or request.num_computed_tokens
        or request.seen_by_worker
    ):
        raise ValueError(f"request {request.request_id!r} is not a waiting request")
    if request.num_tokens >= max_model_len:
        raise ValueError(
            f"request {request.request_id!r} has {request.num_tokens} tokens; this "
            f"worker's max_model_len is {max_model_len}"
        )
