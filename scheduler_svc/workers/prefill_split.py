"""Prefill apart from decode (issue 46, item 4): workers given as --prefill-worker.

A new request goes to a prefill worker. Once its prefill is done there (its first token
sampled: after its last chunk, with chunked prefill), it is parked at once, so that no
later plan there includes it, and moved with its KV (kv_moves.py) to the least loaded
decode worker with room, which decodes it; its stream goes on from there. A move that
fails (no room on any decode worker, a transfer cut, either worker lost) recomputes it
through the orphanage, which resumes requests on decode workers; so does a prefill
worker's loss, for the requests it was still prefilling. Decode workers are given no
other new prompt but:

- a prompt the decode side's prefix cache holds but for at most its last block's worth
  of tokens goes straight to that decode worker: prefilling the rest there costs less
  than a prefill elsewhere and a move (a repeated prompt, a conversation's next turn);
- with no prefill worker connected, new prompts go to the decode workers (colocated, as
  without the flag); with no decode worker connected, a prefill worker keeps and decodes
  its requests (there is nowhere to move them), and the orphanage may use it.

Draining a decode worker moves its requests to the other decode workers (to a prefill
worker only when none is left); draining a prefill worker moves its prefilled requests
to decode workers, and its waiting prompts go to them through the orphanage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog

from scheduler_svc.core.prefix_hash import adapter_root
from scheduler_svc.workers.placement import pick_for_new

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.kv_moves import KvMoves

log = structlog.get_logger("scheduler.prefill_split")


class PrefillSplit:
    """The pool's prefill workers, and the moves of their prefilled requests."""

    def __init__(
        self,
        placeable: Callable[[], Sequence[WorkerEngine]],
        moves: Callable[[], KvMoves],
    ) -> None:
        # The pool's placeable engines (connected, not draining), and its KvMoves
        # (built after this: read when a move starts).
        self._placeable = placeable
        self._moves = moves
        self.addresses: set[str] = set()
        # Requests parked on a prefill worker for their move, until it has ended.
        self._moving: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    def add_prefill_workers(self, addresses: Iterable[str]) -> None:
        self.addresses.update(addresses)

    def is_prefill(self, engine: WorkerEngine) -> bool:
        return engine.address in self.addresses

    def decode_engines(self) -> list[WorkerEngine]:
        """Where a request goes on decoding (resumed, drained): the placeable decode
        workers, or, with none, every placeable worker."""
        placeable = list(self._placeable())
        return [engine for engine in placeable if not self.is_prefill(engine)] or placeable

    def pick(self, engines: Sequence[WorkerEngine], request: Request) -> WorkerEngine:
        """The worker for a new request among `engines` (placement.pick_for_new's rules
        within the side it goes to); raises ServiceError as pick_for_new does."""
        prompt, num_tokens = request.prompt_token_ids, request.max_kv_tokens
        prefill = [engine for engine in engines if self.is_prefill(engine)]
        decode = [engine for engine in engines if not self.is_prefill(engine)]
        if not prefill or not decode:
            return pick_for_new(engines, prompt, num_tokens, request.adapter)
        cached = _decode_side_hit(decode, request)
        if cached is not None:
            return cached
        return pick_for_new(prefill, prompt, num_tokens, request.adapter)

    def after_step(self, engine: WorkerEngine) -> None:
        """A prefill worker's step answered: its requests whose prefill is done are
        parked now and moved to a decode worker (each move a task of its own)."""
        scheduler = engine.scheduler
        if not self.is_prefill(engine) or engine.draining or scheduler is None:
            return
        destinations = [e for e in self._placeable() if not self.is_prefill(e)]
        if not destinations:
            return  # nowhere to move them: they decode here
        for request in list(scheduler.running):
            request_id = request.request_id
            if request_id in self._moving or not _prefilled(request):
                continue
            if not engine.park_now(request_id):
                continue
            self._moving.add(request_id)
            task = asyncio.create_task(
                self._move(engine, request_id, destinations), name=f"prefill handoff {request_id}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._done)

    async def _move(
        self, engine: WorkerEngine, request_id: str, destinations: list[WorkerEngine]
    ) -> None:
        try:
            result = await self._moves().move(engine, request_id, destinations)
            log.debug("prefilled request handed off", request_id=request_id, outcome=result.outcome)
        finally:
            self._moving.discard(request_id)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("prefill handoff failed", error=repr(task.exception()))


def _prefilled(request: Request) -> bool:
    """Its prompt's KV is computed and its first token sampled (a recompute's too: its
    prompt and output, but for the last sampled token, which has no KV yet)."""
    return request.num_output_tokens > 0 and request.num_computed_tokens >= request.num_tokens - 1


def _decode_side_hit(decode: Sequence[WorkerEngine], request: Request) -> WorkerEngine | None:
    """The decode worker whose prefix cache holds the prompt but for at most one block's
    worth of tokens (the most of it, then the least loaded); None if none does."""
    root = () if request.adapter is None else (adapter_root(request.adapter),)
    prompt = request.prompt_token_ids
    best, best_key = None, None
    for engine in decode:
        if not engine.fits(request.max_kv_tokens):
            continue
        hit = engine.cached_prefix_tokens(prompt, *root)
        if hit == 0 or len(prompt) - hit > engine.client.description.block_size:
            continue
        key = (hit, -engine.load)
        if best_key is None or key > best_key:
            best, best_key = engine, key
    return best
