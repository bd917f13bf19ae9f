"""The source's side of the handshake: what it offers each destination on this host, and
which path the answer leaves a transfer on.

Three paths, cheapest first: the source's own pool (pool_read.py: one copy, where the
pool is in shared memory, --kv-pool-shared), a ring segment (shm.py: two copies), bytes
in the messages. Offering the ring costs a segment made and filled with zeros, so it is
offered beside the pool only to a destination that has not yet taken the pool (the
first transfer to it, or one that declined it last time); a destination that declined
every offer is offered nothing for DECLINED_RETRY_S (another host: each offer costs a
round trip). A ring the source cannot make (/dev/shm missing or full) means bytes,
logged once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import ChunkPlan, chunk_bytes, holds_memory
from worker_svc.kv_transfer.pool_read import POOL_ACCEPTED, POOL_OFFER_KEY
from worker_svc.kv_transfer.shm import ACCEPTED, HANDSHAKE_KEY, Ring

log = structlog.get_logger("worker_svc.kv_transfer")

# The destination's answer to an offer comes within this long, or the transfer sends
# bytes (a destination too old to answer answers only at the end).
HANDSHAKE_TIMEOUT_S = 5.0
# A destination that declined shared memory (another host) is not offered it again
# for this long: each offer costs a segment and a round trip.
DECLINED_RETRY_S = 60.0


@dataclass
class Offer:
    """One transfer's offers: the ring's (if made) and the pool's (if shared)."""

    ring: Ring | None = None
    pool: str | None = None

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        offered = self.ring.offer() if self.ring is not None else ()
        if self.pool is not None:
            offered += ((POOL_OFFER_KEY, self.pool),)
        return offered or None

    def release_ring(self) -> None:
        if self.ring is not None:
            self.ring.release()
            self.ring = None


class Offers:
    def __init__(self, shm: bool = True) -> None:
        self.shm = shm
        self._declined: dict[str, float] = {}  # destination -> when it declined all
        self._took_pool: set[str] = set()  # destinations whose last answer was "pool"
        self._shm_failed_logged = False

    def make(self, pool: KVPool, plans: list[ChunkPlan], destination: str) -> Offer:
        """What to offer this destination (nothing: bytes in the messages)."""
        offer = Offer()
        if not self.shm or not holds_memory(pool):
            return offer
        declined = self._declined.get(destination)
        if declined is not None and time.monotonic() - declined < DECLINED_RETRY_S:
            return offer
        if pool.shared_memory is not None:
            offer.pool = pool.shared_memory.offer()
            if destination in self._took_pool:
                return offer
        try:
            offer.ring = Ring([chunk_bytes(pool, plan) for plan in plans])
        except OSError as exc:
            if not self._shm_failed_logged:
                self._shm_failed_logged = True
                log.warning("kv_shm_unavailable", error=str(exc), fallback="grpc bytes")
        return offer

    async def path(self, call, destination: str, offer: Offer) -> str:
        """The destination's answer to the offer: "pool", "shm" (the ring) or "grpc".
        The ring is released unless it is the path."""
        if offer.metadata() is None:
            return "grpc"
        try:
            metadata = await asyncio.wait_for(call.initial_metadata(), HANDSHAKE_TIMEOUT_S)
        except asyncio.TimeoutError:
            metadata = None
        answer = dict(metadata or ()).get(HANDSHAKE_KEY, "no answer")
        if answer == POOL_ACCEPTED and offer.pool is not None:
            self._declined.pop(destination, None)
            self._took_pool.add(destination)
            offer.release_ring()
            return "pool"
        self._took_pool.discard(destination)  # the ring is offered again beside the pool
        if answer == ACCEPTED and offer.ring is not None:
            self._declined.pop(destination, None)
            return "shm"
        ring_offered = offer.ring is not None
        offer.release_ring()
        if call.done():
            return "grpc"  # it failed: its status says why, and it is no answer
        if not ring_offered and offer.pool is not None and answer != "no answer":
            # Only the pool was offered (it took it before): the ring may still do.
            log.info("kv_pool_declined", destination=destination, answer=answer)
            return "grpc"
        if destination not in self._declined:
            log.info("kv_shm_declined", destination=destination, answer=answer)
        self._declined[destination] = time.monotonic()
        return "grpc"
