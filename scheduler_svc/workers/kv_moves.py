"""Moving one running request, with its KV, from one worker to another (issue 46).

1. Detach it from the source engine (engine_moves.py: parked, then out once no plan
   in flight includes it; its blocks held there).
2. Reserve blocks on the destination: the least loaded candidate with room.
3. The source's Worker.SendKv streams those blocks into the destination's (the
   workers talk to each other; the scheduler waits for the answer, under a deadline
   that grows with the blocks), beside both engines' steps.
4. Success: the source's blocks are freed, and the destination takes the request in,
   running over the moved KV (core/parking.py): its client's stream goes on there.
   Anything else (no room anywhere, either worker failing or lost, the deadline): the
   destination's blocks are freed, the source's too, and the request is handed over
   by recompute, as a lost worker's is (the pool's orphanage): prefilled over prompt
   and output elsewhere, token-identical. Nothing the client was sent is lost or
   repeated either way, since the request's tokens never change in a move.

While it moves, its client's handle points at the move: a client that leaves then is
noted, and the move ends with the request dropped on both sides.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from common.errors import ServiceError
from scheduler_svc.core import handover
from scheduler_svc.workers.handle import Migrant
from scheduler_svc.workers.liveness import WorkerLost

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request
    from scheduler_svc.kv_metrics import KvTransferMetrics
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.engine_moves import Reservation
    from scheduler_svc.workers.orphans import Orphanage

log = structlog.get_logger("scheduler.kv_moves")

# A transfer's deadline: a fixed allowance plus one per block (a block of a small model
# is well under a megabyte; of a large one, tens of them over a slow link).
TRANSFER_BASE_TIMEOUT_S = 10.0
TRANSFER_TIMEOUT_PER_BLOCK_S = 0.05

# Unique in the process, as SendKvRequest.transfer_id asks.
_transfer_ids = itertools.count(1)


class MoveOutcome(enum.Enum):
    MOVED = "moved"  # it goes on elsewhere with its KV
    RECOMPUTED = "recomputed"  # it goes on elsewhere, its KV computed again
    REQUEUED = "requeued"  # it had no KV yet (or was not running): queued elsewhere
    GONE = "gone"  # it finished, its client left, or its worker was lost meanwhile


@dataclass(frozen=True)
class MoveResult:
    outcome: MoveOutcome
    num_blocks: int = 0
    num_bytes: int = 0
    num_tokens: int = 0


class _InTransfer:
    """The handle's holder while the request's KV moves: a client leaving is noted."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.aborted = False

    def abort_local(self, request_id: str) -> bool:
        self.aborted = True
        return True


class KvMoves:
    def __init__(self, orphans: Orphanage, metrics: KvTransferMetrics | None = None) -> None:
        # Where a request whose KV cannot move goes to be recomputed.
        self.orphans = orphans
        self.metrics = metrics

    async def move(
        self,
        source: WorkerEngine,
        request_id: str,
        destinations: Sequence[WorkerEngine],
        hold_lookahead: bool = False,
    ) -> MoveResult:
        """Moves the request off `source` to one of `destinations` (see the module doc);
        hold_lookahead: the destination plans one step ahead at most until it takes the
        request in (engine_moves.reserve_kv: the request's pause is a step shorter)."""
        parked_at = time.monotonic()
        request = source.parked_for_move(request_id)
        if request is None:
            return MoveResult(MoveOutcome.GONE)
        # Reserved now, while the source settles: the KV's size is final at parking, and
        # the destination's plans in flight answer meanwhile (parking.py).
        destination, reservation = self._reserve(
            request, request.num_computed_tokens, destinations, hold_lookahead
        )
        if destination is None:
            detached, writable = await source.detach(request_id), False
        else:
            detached, writable = await asyncio.gather(
                source.detach(request_id), destination.until_writable(reservation)
            )
        if detached is None:
            if destination is not None:
                destination.cancel_reservation(reservation, request)
            return MoveResult(MoveOutcome.GONE)
        handle = detached.handle
        if destination is not None and (
            not writable or detached.num_tokens > reservation.num_tokens
        ):
            destination.cancel_reservation(reservation, request)
            destination = None
        if destination is None:
            # No room before it settled (or that destination went): a place now, if any.
            destination, reservation = self._reserve(
                request, detached.num_tokens, destinations, hold_lookahead
            )
            if destination is None or not await destination.until_writable(reservation):
                if destination is not None:
                    destination.cancel_reservation(reservation, request)
                source.release_hold(detached)
                log.info(
                    "no room for a request's KV elsewhere; recomputing it", request_id=request_id
                )
                self._recompute(request, handle)
                return MoveResult(MoveOutcome.RECOMPUTED)
        holder = _InTransfer(source.address)
        handle.holder = holder
        transfer_id = next(_transfer_ids)
        num_blocks = len(detached.block_ids)
        timeout_s = TRANSFER_BASE_TIMEOUT_S + TRANSFER_TIMEOUT_PER_BLOCK_S * num_blocks
        started = time.monotonic()
        error: Exception | None = None
        try:
            reply = await source.client.send_kv(
                transfer_id,
                destination.address,
                list(detached.block_ids),
                # Fewer tokens settled than were reserved for (drafts rejected): the
                # reservation's first blocks.
                list(reservation.block_ids[: len(detached.block_ids)]),
                detached.num_tokens,
                timeout_s,
            )
        except (ServiceError, WorkerLost) as failure:
            error = failure
        seconds = time.monotonic() - started
        source.release_hold(detached)
        if holder.aborted:
            destination.cancel_reservation(reservation, request)
            return MoveResult(MoveOutcome.GONE)
        if error is None and destination.adopt_with_kv(
            request, handle, reservation, detached.num_tokens
        ):
            handle.moved_from.append(source.address)
            if self.metrics is not None:
                self.metrics.moved(num_blocks, reply.bytes_sent, detached.num_tokens, seconds)
            log.info(
                "request moved with its KV",
                request_id=request_id,
                transfer_id=transfer_id,
                source=source.address,
                destination=destination.address,
                blocks=num_blocks,
                tokens=detached.num_tokens,
                bytes=reply.bytes_sent,
                seconds=round(seconds, 4),
                # Where the request's pause went (bench/drain.py reads these): the wait
                # for its plans in flight, then the transfer (`seconds`); adopted_at is
                # monotonic, to be compared with its next token's arrival on this host.
                park_wait_s=round(started - parked_at, 4),
                adopted_at=round(time.monotonic(), 6),
            )
            return MoveResult(MoveOutcome.MOVED, num_blocks, reply.bytes_sent, detached.num_tokens)
        destination.cancel_reservation(reservation, request)
        if self.metrics is not None:
            self.metrics.failed(seconds)
        log.warning(
            "KV transfer failed; recomputing the request",
            request_id=request_id,
            transfer_id=transfer_id,
            source=source.address,
            destination=destination.address,
            error=str(error) if error is not None else "the destination was lost",
        )
        self._recompute(request, handle)
        return MoveResult(MoveOutcome.RECOMPUTED)

    @staticmethod
    def _reserve(
        request: Request,
        num_tokens: int,
        destinations: Sequence[WorkerEngine],
        hold_lookahead: bool,
    ) -> tuple[WorkerEngine | None, Reservation | None]:
        """The least loaded destination with room for num_tokens of the request's KV."""
        for candidate in sorted(destinations, key=lambda engine: engine.load):
            reservation = candidate.reserve_kv(request, num_tokens, hold_lookahead)
            if reservation is not None:
                return candidate, reservation
        return None, None

    def _recompute(self, request, handle) -> None:
        handover.reset_for_recompute(request)
        self.orphans.take_in([Migrant(request, handle, time.monotonic())])
