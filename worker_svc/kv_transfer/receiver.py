"""ReceiveKv, the destination's side: check the source's layout, then write each chunk
into the blocks it names, beside the steps.

A chunk is checked, turned from bytes into a tensor and written into its blocks on a
thread of its own, without the runner's lock: the blocks are ones the scheduler set
aside for the moving request, which no plan reads before the source's SendKv answered,
and which no plan already sent writes either (the scheduler waits, before SendKv, for
the plans that were in flight when it set them aside: one of them may still write a
block freed meanwhile). So a step never waits for a chunk, nor a chunk for a step (it
did, for a whole step, when the writes took the lock). Nothing outside the named
blocks is touched: a stream cut midway leaves those blocks' contents undefined and
everything else as it was (the scheduler then frees them and recomputes).

A source on this host may offer a shared-memory segment (shm.py): the destination maps
it and unlinks its name before the first chunk, and answers "ok" in its initial
metadata, or "no: REASON" (--no-kv-transfer-shm, another host's segment) and the
chunks carry bytes. A chunk in a segment is written from a view of the mapping, with no
copy before the pool's own, and then counted in the segment's header so that the source
may reuse its slot. A source whose pool is in shared memory offers the pool itself
too (pool_read.py): mapped, it is answered "pool" and each chunk names source blocks
to copy from it, one copy in all. A chunk naming a segment or a source pool that was
not mapped fails the transfer with FAILED_PRECONDITION.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2
from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.landing import Landings
from worker_svc.kv_transfer.layout import (
    LayoutMismatch,
    TransferError,
    bytes_to_slots,
    check_chunk,
    check_layout,
    holds_memory,
    payload_bytes,
    slot_bytes,
    view_slots,
    write_blocks,
)
from worker_svc.kv_transfer.pool_read import (
    POOL_ACCEPTED,
    POOL_OFFER_KEY,
    SourcePool,
    SourcePools,
    copy_chunk,
)
from worker_svc.kv_transfer.shm import ACCEPTED, HANDSHAKE_KEY, Segment, parse_offer

log = structlog.get_logger("worker_svc.kv_transfer")


class SegmentUnavailable(Exception):
    """A chunk in a shared-memory segment this worker has not mapped: FAILED_PRECONDITION."""


def write_chunk(pool: KVPool, chunk: worker_pb2.KvChunk) -> None:
    """One chunk checked (TransferError), turned into slots and written (a thread's work)."""
    check_chunk(pool, chunk)
    if holds_memory(pool):
        write_blocks(pool, tuple(chunk.destination_block_ids), bytes_to_slots(pool, chunk))


def write_shm_chunk(pool: KVPool, chunk: worker_pb2.KvChunk, segment: Segment, index: int):
    """A chunk in the segment checked, written from it, and counted (a thread's work)."""
    check_chunk(pool, chunk)
    try:
        view = segment.view(chunk.shm_offset, chunk.shm_bytes)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    write_blocks(pool, tuple(chunk.destination_block_ids), view_slots(pool, chunk, view))
    del view  # the mapping may be closed once the last view is gone
    segment.count_consumed(index + 1)


class Mapped:
    """What one transfer mapped of the source's offers: its pool or its ring segment
    (at most one), or why neither."""

    def __init__(self, source_pools: SourcePools) -> None:
        self.source_pools = source_pools
        self.source_pool: SourcePool | None = None
        self.segment: Segment | None = None
        self.refusal = ""
        self.failed = True  # until the transfer answers

    def attach(self, pool_offer: str | None, ring_offer: str | None) -> None:
        refusals = []
        if pool_offer is not None:
            try:
                self.source_pool = self.source_pools.open(pool_offer)
                return
            except (OSError, ValueError) as exc:
                refusals.append(f"the destination could not map the source's pool: {exc}")
        if ring_offer is not None:
            try:
                self.segment = Segment.attach(*parse_offer(ring_offer))
                return
            except (OSError, ValueError) as exc:
                refusals.append(f"the destination could not map it: {exc}")
        self.refusal = "; ".join(refusals)

    def close(self) -> None:
        if self.source_pool is not None:
            self.source_pools.done(self.source_pool, self.failed)
        if self.segment is not None:
            self.segment.close()


class KvReceiver:
    def __init__(self, shm: bool = True) -> None:
        self.shm = shm
        # Transfers in progress: while any is, the servicer runs no step on the event
        # loop, which would hold each chunk for a whole step (step_placement.runs_inline).
        self.active = 0
        # Chunks written from shared memory since start (tests: the path the bytes took):
        # from a ring segment, from the source's pool.
        self.shm_chunks = self.pool_chunks = 0
        # The source pools mapped, kept between transfers (pool_read.py).
        self.source_pools = SourcePools()
        # Each transfer's blocks against those the steps take (landing.py).
        self.landings = Landings()

    async def receive(
        self, pool: KVPool, chunks: AsyncIterator[worker_pb2.KvChunk], context
    ) -> worker_pb2.ReceiveKvReply:
        self.active += 1
        mapped = Mapped(self.source_pools)
        try:
            await self._answer_offer(pool, context, mapped)
            reply = await self._receive(pool, chunks, context, mapped)
            mapped.failed = False
            return reply
        finally:
            self.active -= 1
            mapped.close()

    async def _answer_offer(self, pool: KVPool, context, mapped: Mapped) -> None:
        """The source's shared-memory offers mapped (its pool first, else its ring) and
        answered; mapped.refusal says why not (for a chunk that names one anyway)."""
        metadata = dict(context.invocation_metadata() or ())
        ring_offer, pool_offer = metadata.get(HANDSHAKE_KEY), metadata.get(POOL_OFFER_KEY)
        if ring_offer is None and pool_offer is None:
            mapped.refusal = "the source offered no shared memory"
            return
        if not self.shm:
            mapped.refusal = "shared memory is off on the destination (--no-kv-transfer-shm)"
        elif not holds_memory(pool):
            mapped.refusal = "the destination's pool holds no memory"
        else:
            mapped.attach(pool_offer, ring_offer)
        if mapped.source_pool is not None:
            answer = POOL_ACCEPTED
        else:
            answer = ACCEPTED if mapped.segment else f"no: {mapped.refusal}"
        await context.send_initial_metadata(((HANDSHAKE_KEY, answer),))

    async def _receive(
        self,
        pool: KVPool,
        chunks: AsyncIterator[worker_pb2.KvChunk],
        context,
        mapped: Mapped,
    ) -> worker_pb2.ReceiveKvReply:
        started = time.perf_counter()
        transfer_id = None
        received_bytes = received_blocks = chunks_seen = 0
        landing = self.landings.open()
        try:
            async for chunk in chunks:
                if transfer_id is None:
                    transfer_id = chunk.transfer_id
                    if not chunk.HasField("layout"):
                        raise TransferError("the first chunk of a transfer carries its layout")
                    check_layout(pool, chunk.layout)
                elif chunk.transfer_id != transfer_id:
                    raise TransferError(
                        f"chunk of transfer {chunk.transfer_id} in transfer {transfer_id}"
                    )
                blocks = tuple(chunk.destination_block_ids)
                segment = mapped.segment
                if chunk.source_block_ids:
                    if mapped.source_pool is None:
                        raise SegmentUnavailable(
                            "a chunk naming the source's pool blocks, which this worker "
                            f"has not mapped: {mapped.refusal or 'the source offered none'}"
                        )
                    copy = functools.partial(copy_chunk, pool, chunk, mapped.source_pool)
                    await landing.land(blocks, copy)
                    self.pool_chunks += 1
                    received_bytes += sum(chunk.filled_slots) * slot_bytes(pool)
                elif not chunk.shm_name:
                    await landing.land(blocks, functools.partial(write_chunk, pool, chunk))
                elif segment is None or chunk.shm_name != segment.name:
                    raise SegmentUnavailable(
                        f"a chunk in shared-memory segment {chunk.shm_name!r}, which this "
                        "worker has not mapped: "
                        f"{mapped.refusal or 'the source offered another'}"
                    )
                else:
                    write = functools.partial(write_shm_chunk, pool, chunk, segment, chunks_seen)
                    await landing.land(blocks, write)
                    self.shm_chunks += 1
                chunks_seen += 1
                received_bytes += payload_bytes(chunk)
                received_blocks += len(chunk.destination_block_ids)
        except (LayoutMismatch, SegmentUnavailable) as exc:
            log.warning("kv_receive_refused", transfer_id=transfer_id, error=str(exc))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TransferError as exc:
            log.warning("kv_receive_refused", transfer_id=transfer_id, error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            # A cut stream cancels this call, not the write in its thread: it ends first
            # (the segment it may read is closed after, and steps wait for it: landing.py).
            await landing.settled()
            self.landings.close(landing)
        if transfer_id is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a transfer without chunks")
        log.info(
            "kv_received",
            transfer_id=transfer_id,
            peer=context.peer(),
            blocks=received_blocks,
            bytes=received_bytes,
            seconds=round(time.perf_counter() - started, 4),
        )
        return worker_pb2.ReceiveKvReply(bytes_received=received_bytes, num_blocks=received_blocks)
