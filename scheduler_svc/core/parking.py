"""Moving a running request to another worker with its KV (issue 46): one scheduler's
half on each side. The I/O between them is workers/kv_moves.py's.

On the source:
1. `park`: the request leaves the running queue, so no new plan includes it; it stays in
   the table with its blocks, and a plan already in flight that includes it (async
   scheduling keeps one out) still answers into it: its token is taken as usual, its
   stops checked (it may finish there, and then there is nothing to move).
2. `settled`: no plan in flight includes it any more. Its blocks now hold exactly
   num_computed_tokens of KV (every token but the last sampled one), and nothing
   writes them: the worker may read them out.
3. `detach`: it leaves the scheduler, its blocks kept, held under its seq_id until
   `release_hold` (after the transfer, whatever its outcome); the worker is told to drop
   the sequence (its run state; the blocks' contents stay, as nothing else gets them).
   `unpark` instead returns a parked request to planning (the move was given up, or
   the worker was lost and take_unfinished must find it).

On the destination:
4. `reserve`: blocks for all its tokens (the KV that moves, then the next token),
   under its seq_id, out of every other sequence's reach; no room (beyond the
   watermark, or the running cap reached): None, and it is recomputed instead.
   Done as soon as the request is parked on the source: its num_computed_tokens is
   final then (what the plans in flight compute counts as computed already). A block
   freed while a plan in flight still wrote its old owner's KV may be among those
   reserved, so nothing is written into them until `answered_through(scheduler,
   last_plan_sent(...) at the reservation)`: that wait and the source's settling
   overlap.
5. `adopt_with_kv` once the transfer has written them: it enters as running with
   num_computed_tokens = the tokens moved. Its next plan carries it as a NewSequence
   over prompt + output with those tokens computed, as a prefix-cache hit is: the
   worker computes the last sampled token and samples the next one, with the seeded
   sampler at that position, so the stream goes on token-identical. Its full blocks
   enter this worker's prefix cache at that step, as computed blocks do.
   `release_reservation` instead, when the transfer failed.

Plain bookkeeping on the Scheduler's parts (queue, table, block manager, plans in
flight), like handover.py; no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from scheduler_svc.core import handover
from scheduler_svc.core.request import Request, RequestStatus
from scheduler_svc.core.scheduler import Scheduler


@dataclass(frozen=True)
class KvHold:
    """A detached request's KV on its source: the blocks holding num_tokens tokens."""

    block_ids: tuple[int, ...]
    num_tokens: int


def _running_order(request: Request) -> tuple[int, float, int]:
    return request.running_order


def park(scheduler: Scheduler, request: Request) -> None:
    """Stops planning a running request; raises ValueError if it is not running there."""
    if request.status is not RequestStatus.RUNNING or request not in scheduler.queue.running:
        raise ValueError(f"request {request.request_id!r} is not running on this worker")
    scheduler.queue.running.remove(request)


def unpark(scheduler: Scheduler, request: Request) -> None:
    """Plans a parked request again (a no-op if it has finished since it was parked)."""
    if request.status is not RequestStatus.RUNNING:
        return
    if scheduler.requests.get(request.request_id) is not request:
        return
    if request not in scheduler.queue.running:
        bisect.insort(scheduler.queue.running, request, key=_running_order)


def settled(scheduler: Scheduler, request: Request) -> bool:
    """Whether no plan in flight computes or samples for the request."""
    # The plans in flight are the scheduler's own; parking is its friend in core/.
    return not scheduler._in_flight.includes(request)


def detach(scheduler: Scheduler, request: Request) -> KvHold:
    """Takes a parked, settled request out of the scheduler with its KV's blocks held;
    raises ValueError for one that is not."""
    if not settled(scheduler, request) or request in scheduler.queue.running:
        raise ValueError(f"request {request.request_id!r} is not parked and settled")
    if request.num_pending_samples:
        raise ValueError(f"request {request.request_id!r} still waits for a sampled token")
    manager = scheduler.block_manager
    num_tokens = request.num_computed_tokens
    table = manager.block_table(request.seq_id)
    hold = KvHold(tuple(table[: manager.blocks_needed(num_tokens)]), num_tokens)
    scheduler.requests.hand_off(request)
    request.seen_by_worker = False
    request.num_bypassed = 0
    return hold


def release_hold(scheduler: Scheduler, request: Request) -> None:
    """Frees a detached request's blocks on its source (its KV has moved, or never will)."""
    manager = scheduler.block_manager
    if scheduler.requests.get(request.request_id) is None and manager.has_blocks(request.seq_id):
        manager.free(request.seq_id)


def reserve(scheduler: Scheduler, request: Request, num_tokens: int) -> list[int] | None:
    """The blocks num_tokens of the request's KV go into, the request's whole table
    allocated; None when this worker has no room for it."""
    manager = scheduler.block_manager
    if request.request_id in scheduler.requests or manager.has_blocks(request.seq_id):
        raise ValueError(f"request {request.request_id!r} is already on this worker")
    if request.num_tokens >= scheduler.max_model_len:
        return None
    if len(scheduler.queue.running) >= scheduler.config.max_running_seqs:
        return None
    # Reserved while the source settles, num_tokens may pass the tokens known yet (a
    # plan in flight computes the KV of a token still being sampled).
    slots = max(request.num_tokens, num_tokens)
    # The room admission keeps beside running requests for their next decodes.
    watermark = int(scheduler.config.watermark * manager.num_blocks) * manager.block_size
    if not manager.can_allocate(slots + watermark):
        return None
    table = manager.allocate(request.seq_id, slots)
    return table[: manager.blocks_needed(num_tokens)]


def last_plan_sent(scheduler: Scheduler) -> int:
    """The step id of the newest plan sent to the worker (0: none yet)."""
    return scheduler._in_flight.last_sent()


def answered_through(scheduler: Scheduler, step_id: int) -> bool:
    """Whether every plan up to step_id has answered: none of them writes KV any more."""
    return scheduler._in_flight.answered_through(step_id)


def limit_lookahead(scheduler: Scheduler, plans: int) -> None:
    """At most `plans` plans in flight from now on (async scheduling keeps two). With one,
    a request adopted while a plan runs is in the very next plan the worker runs, not
    behind one queued already: a moved request's pause is a step shorter."""
    scheduler._in_flight.max_in_flight = plans


def release_reservation(scheduler: Scheduler, request: Request) -> None:
    """Frees the blocks reserve took (the transfer failed)."""
    release_hold(scheduler, request)


def adopt_with_kv(scheduler: Scheduler, request: Request, num_tokens: int) -> None:
    """Enters a detached request as running with num_tokens of KV in the blocks reserve
    gave it; raises ValueError without a reservation."""
    if request.request_id in scheduler.requests:
        raise ValueError(f"request id {request.request_id!r} is already scheduled")
    if not scheduler.block_manager.has_blocks(request.seq_id):
        raise ValueError(f"request {request.request_id!r} has no blocks reserved here")
    # enter() tells the table, the deadlines and the adapter slots of it, and queues it
    # waiting; it runs at once instead, as admission would have made it.
    scheduler.requests.enter(request)
    scheduler.queue.waiting.remove(request)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_tokens
    request.num_pending_samples = 0
    request.seen_by_worker = False
    bisect.insort(scheduler.queue.running, request, key=_running_order)


def take_waiting(scheduler: Scheduler) -> list[Request]:
    """The waiting requests (no KV to move), out of the scheduler and ready for `adopt`
    on another worker, best first: what a drain requeues."""
    taken = list(scheduler.queue.waiting)
    for request in taken:
        scheduler.requests.leave_unfinished(request)
        handover.reset_for_recompute(request)
    return taken
