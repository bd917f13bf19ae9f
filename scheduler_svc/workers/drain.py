"""Draining one worker: every request on it goes on elsewhere, then it leaves service
(`cbserve drain`, AdminService.DrainWorker, a worker removed from discovery).

The engine is marked draining first, so placement and the orphanage give it nothing
new. Then, in rounds until it holds nothing: its waiting requests (no KV yet) are
requeued through the orphanage, and its running ones moved with their KV
(kv_moves.py), a few at a time so that the workers' other streams keep their share
of the network and the source's steps go on between transfers. A running request
whose KV cannot move is recomputed elsewhere; one preempted while others moved is
requeued in the next round. What takes the worker out afterwards is the pool's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from scheduler_svc.workers.kv_moves import KvMoves, MoveOutcome, MoveResult

if TYPE_CHECKING:
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.pool_view import PoolView

log = structlog.get_logger("scheduler.drain")

# Transfers out of one draining worker at once.
PARALLEL_MOVES = 4
# Rounds before giving up on requests that keep not leaving (cannot happen: a
# request finishes, moves or is requeued in each round; never hang a drain on one).
MAX_ROUNDS = 100


@dataclass
class DrainCounts:
    """What a drain did: DrainWorkerResponse's fields."""

    requests_moved: int = 0
    requests_recomputed: int = 0
    requests_requeued: int = 0
    blocks_moved: int = 0
    bytes_moved: int = 0
    tokens_not_recomputed: int = 0
    seconds: float = 0.0

    def add(self, result: MoveResult) -> None:
        if result.outcome is MoveOutcome.MOVED:
            self.requests_moved += 1
            self.blocks_moved += result.num_blocks
            self.bytes_moved += result.num_bytes
            self.tokens_not_recomputed += result.num_tokens
        elif result.outcome is MoveOutcome.RECOMPUTED:
            self.requests_recomputed += 1
        elif result.outcome is MoveOutcome.REQUEUED:
            self.requests_requeued += 1

    @property
    def requests_drained(self) -> int:
        return self.requests_moved + self.requests_recomputed + self.requests_requeued


_background: set[asyncio.Task] = set()


def drain_in_background(engine: WorkerEngine, pool: PoolView) -> None:
    """A worker shutting down (shutdown_watch.py): drained now, beside everything else."""
    destinations, moves = pool.placeable_engines, pool.kv_moves
    if not [other for other in destinations() if other is not engine]:
        log.warning("worker shutting down, no other to move its requests to", worker=engine.address)
        return

    def done(task: asyncio.Task) -> None:
        _background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("drain failed", worker=engine.address, error=repr(task.exception()))

    task = asyncio.create_task(drain_engine(engine, destinations, moves), name="drain")
    _background.add(task)
    task.add_done_callback(done)


async def drain_engine(
    engine: WorkerEngine,
    destinations: Callable[[], Sequence[WorkerEngine]],
    moves: KvMoves,
) -> DrainCounts:
    """Moves everything off `engine` (marked draining) onto `destinations()`."""
    engine.draining = True
    counts = DrainCounts()
    started = time.monotonic()
    gate = asyncio.Semaphore(PARALLEL_MOVES)

    async def move(request_id: str) -> None:
        async with gate:
            counts.add(await moves.move(engine, request_id, destinations(), hold_lookahead=True))

    for _ in range(MAX_ROUNDS):
        scheduler = engine.scheduler
        if scheduler is None or not engine.connected:
            break  # lost: its requests are handed over by recompute already
        migrants = engine.take_waiting_migrants()
        if migrants:
            counts.requests_requeued += len(migrants)
            moves.orphans.take_in(migrants)
        running = [request.request_id for request in scheduler.running]
        if not running:
            break
        await asyncio.gather(*(move(request_id) for request_id in running))
    counts.seconds = time.monotonic() - started
    if moves.metrics is not None:
        moves.metrics.drained.inc(counts.requests_drained)
    log.info("worker drained", worker=engine.address, **vars(counts))
    return counts
