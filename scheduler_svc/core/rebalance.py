"""Rebalance (issue 46): a worker whose pool is full moves a request, with its KV, to a
worker with room instead of preempting it. The rule is here, plain arithmetic over
the schedulers' parts; the move itself is workers/rebalance.py's and kv_moves.py's.

Where: AdmissionQueue.make_room, when a running request needs a block and none is
free. Instead of preempting the victim it picked (the worst preemptible request, maybe
the requester itself), it offers it to its `mover` (a VictimMover, victim_mover.py); one
taken is parked there and then (core/parking.py): it leaves the running queue, so it
takes no block any more, which is all preemption was for. Its blocks come back once its
KV has moved (or its move gave up: then it is recomputed, as preemption would have), so
while a move off this worker is under way a request that needs a block waits a step or
two for them instead of preempting another.

Move or recompute: preemption costs the victim's prefill over prompt + output again
(and the blocks of every token it recomputes, on some worker, later); a move costs
its blocks' bytes over the network and a transfer's fixed round trips, and needs a
destination with room now. A request of fewer than `min_blocks` blocks of KV is
cheaper to recompute than to move (its prefill is one short step); from there the
move wins, and by more the longer the request: prefill grows with tokens (and
attention with their square), a transfer with blocks only. A destination takes it
only when it has room for all of it beyond the watermark, nobody waits for room
there, and it runs fewer than max_num_seqs; so a move never makes a destination
preempt in turn. At most `max_per_request` moves of one request by rebalance (two
full workers never toss a request back and forth), and `max_per_worker` at once
off one worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler_svc.core.request import Request

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler


@dataclass(frozen=True)
class RebalanceRule:
    # Below this many blocks of KV the victim is recomputed: its prefill is one short
    # step, less than a transfer's round trips and the destination's extra step.
    min_blocks: int = 2
    # Moves at once off one worker (each frees a request's blocks there).
    max_per_worker: int = 2
    # Moves of one request by rebalance, over its life.
    max_per_request: int = 1

    def __post_init__(self) -> None:
        for name in ("min_blocks", "max_per_worker", "max_per_request"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def worth_moving(self, source: Scheduler, request: Request) -> bool:
        """Whether moving the request's KV beats recomputing it."""
        manager = source.block_manager
        return manager.blocks_needed(request.num_computed_tokens) >= self.min_blocks


def has_room(destination: Scheduler, request: Request) -> bool:
    """Whether the destination can take the request now without preempting there: all
    its tokens and the next beyond the watermark, nobody waiting, a running slot free."""
    if destination.waiting:
        return False
    if len(destination.running) >= destination.config.max_running_seqs:
        return False
    if request.num_tokens + 1 > destination.max_model_len:
        return False
    manager = destination.block_manager
    watermark = int(destination.config.watermark * manager.num_blocks)
    return manager.can_allocate(request.num_tokens + 1 + watermark * manager.block_size)
