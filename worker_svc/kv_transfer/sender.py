"""SendKv, the source's side: read the blocks a chunk at a time and stream them to the
destination's ReceiveKv.

Each chunk's blocks are copied out of the pool on a thread of their own, beside the
steps and without the runner's lock: the scheduler sends only the blocks of a request
it has parked and settled (no plan in flight or to come writes them until SendKv has
answered), and a block it shares with other requests is a full prefix block, which
nobody writes. A step thus never waits for a send, nor a send for a step (it did, for a
whole step at each end, when the copies took the lock).

Where the bytes go, decided per transfer by the handshake (offers.py): nowhere, where
the destination is on this host and maps this worker's shared pool (pool_read.py: it
copies the blocks itself, the chunks name them); into a shared-memory segment where it
maps that (shm.py: the ring of chunk slots that bounds what is in memory); else into
the messages themselves, where turning the copy into bytes and sending it happen on
the same thread hop and gRPC's flow control paces the reads. --no-kv-transfer-shm
sends bytes always.

Worker-to-worker channels are plaintext, one per destination address, kept for the next
transfer. A destination started with --tls-cert cannot be reached by them (the call fails
with UNAVAILABLE naming the address): TLS between workers is not supported yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2, worker_pb2_grpc
from common.grpc_options import channel_options
from common.grpc_status import connection_broke
from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import (
    ChunkPlan,
    TransferError,
    blocks_to_bytes,
    chunk_bytes,
    gather_blocks,
    gather_into,
    holds_memory,
    plan_chunks,
    pool_layout,
)
from worker_svc.kv_transfer.offers import Offers
from worker_svc.kv_transfer.pool_read import POOL_CHUNK_TARGET_BYTES
from worker_svc.kv_transfer.shm import Ring, TransferEnded

log = structlog.get_logger("worker_svc.kv_transfer")

# A destination that stops answering pings is found within this many seconds, so that a
# transfer to a dead or stopped worker fails instead of hanging until the deadline.
KEEPALIVE_TIMEOUT_S = 10.0
# A destination that restarted is dialled again within about a second, not after grpc's
# default backoff of up to two minutes.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# For fault tests only: each chunk waits this long before it goes, so that a test can kill
# either end mid-transfer however fast the machine is (0, the default: no wait).
CHUNK_PAUSE_S = float(os.environ.get("CBSERVE_KV_CHUNK_PAUSE_S", "0"))


class DestinationChannels:
    """One grpc.aio channel per destination address, opened on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        channel = self._channels.get(address)
        if channel is None:
            options = [*channel_options(KEEPALIVE_TIMEOUT_S), *RECONNECT_OPTIONS]
            channel = self._channels[address] = grpc.aio.insecure_channel(address, options)
        return worker_pb2_grpc.WorkerStub(channel)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def read_chunk(pool: KVPool, plan: ChunkPlan) -> bytes:
    """One chunk's data (a thread's work): its blocks copied out of the pool, as bytes."""
    if not holds_memory(pool):
        return b""
    return blocks_to_bytes(gather_blocks(pool, plan.source_block_ids), plan.filled_slots)


def fill_slot(pool: KVPool, plan: ChunkPlan, ring: Ring, index: int) -> tuple[int, int]:
    """One chunk gathered into its ring slot once that is free (a thread's work): its
    offset and length in the segment."""
    nbytes = chunk_bytes(pool, plan)
    offset, view = ring.slot(index, nbytes)
    gather_into(pool, plan, view)
    return offset, nbytes


class fill_ahead:  # noqa: N801 (used as a function)
    """The ring's slots filled one chunk after another on a thread of their own, ahead of
    the messages that name them (as far as the ring's free slots allow): no chunk's
    gather waits for the event loop to send the one before. next() answers each chunk's
    (offset, bytes) in order, or raises what ended the filling (TransferEnded)."""

    def __init__(self, pool: KVPool, plans: list[ChunkPlan], ring: Ring) -> None:
        loop = asyncio.get_running_loop()
        self._filled: asyncio.Queue = asyncio.Queue()

        def fill_all() -> None:
            for index, plan in enumerate(plans):
                loop.call_soon_threadsafe(
                    self._filled.put_nowait, fill_slot(pool, plan, ring, index)
                )

        self._filling = asyncio.ensure_future(asyncio.to_thread(fill_all))
        # Retrieved here: a transfer that failed may never ask for the next chunk.
        self._filling.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def next(self) -> tuple[int, int]:
        if not self._filled.empty():
            return self._filled.get_nowait()
        getter = asyncio.ensure_future(self._filled.get())
        await asyncio.wait((getter, self._filling), return_when=asyncio.FIRST_COMPLETED)
        if getter.done() or self._filling.exception() is None:
            return await getter
        getter.cancel()
        raise self._filling.exception()


@dataclass
class SendCounts:
    bytes: int = 0
    chunks: int = 0
    path: str = "grpc"


class KvSender:
    def __init__(self, shm: bool = True) -> None:
        self.channels = DestinationChannels()
        self.offers = Offers(shm)
        # Sends in progress: while any is, the servicer runs no step on the event loop,
        # which would hold each chunk for a whole step (step_placement.runs_inline).
        self.active = 0
        # Transfers by path ("pool" once one goes that way).
        self.transfers_by_path: dict[str, int] = {"shm": 0, "grpc": 0}

    async def send(
        self, pool: KVPool, request: worker_pb2.SendKvRequest, context
    ) -> worker_pb2.SendKvReply:
        self.active += 1
        try:
            return await self._send(pool, request, context)
        finally:
            self.active -= 1

    async def _send(
        self, pool: KVPool, request: worker_pb2.SendKvRequest, context
    ) -> worker_pb2.SendKvReply:
        started = time.perf_counter()
        try:
            if not request.destination:
                raise TransferError("no destination address")
            plans = plan_chunks(
                pool,
                list(request.source_block_ids),
                list(request.destination_block_ids),
                request.num_tokens,
            )
        except TransferError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        sent = SendCounts()
        offer = self.offers.make(pool, plans, request.destination)
        stub = self.channels.stub(request.destination)
        call = stub.ReceiveKv(timeout=context.time_remaining(), metadata=offer.metadata())
        try:
            if offer.ring is not None:
                ended = offer.ring.ended
                call.add_done_callback(lambda _call: ended.set())
            sent.path = await self.offers.path(call, request.destination, offer)
            if sent.path == "pool":  # no bytes held anywhere: fewer, larger chunks
                plans = plan_chunks(
                    pool,
                    list(request.source_block_ids),
                    list(request.destination_block_ids),
                    request.num_tokens,
                    target_bytes=POOL_CHUNK_TARGET_BYTES,
                )
            # The call may end early (InvalidStateError, TransferEnded): awaiting it
            # below raises its status.
            with contextlib.suppress(asyncio.InvalidStateError, TransferEnded):
                await self._stream(call, pool, request, plans, offer.ring, sent)
            await call
        except grpc.aio.AioRpcError as exc:
            await self._failed(request, exc, context)
        finally:
            offer.release_ring()
            if not call.done():
                call.cancel()
        seconds = time.perf_counter() - started
        self.transfers_by_path[sent.path] = self.transfers_by_path.get(sent.path, 0) + 1
        log.info(
            "kv_sent",
            transfer_id=request.transfer_id,
            destination=request.destination,
            path=sent.path,
            blocks=sum(len(p.source_block_ids) for p in plans),
            tokens=request.num_tokens,
            bytes=sent.bytes,
            chunks=sent.chunks,
            seconds=round(seconds, 4),
        )
        return worker_pb2.SendKvReply(
            bytes_sent=sent.bytes, num_chunks=sent.chunks, seconds=seconds
        )

    async def _stream(self, call, pool, request, plans, ring: Ring | None, sent) -> None:
        filled = fill_ahead(pool, plans, ring) if ring is not None else None
        for index, plan in enumerate(plans):
            if CHUNK_PAUSE_S:  # before each message, either path (the ring fills ahead)
                await asyncio.sleep(CHUNK_PAUSE_S)
            chunk = worker_pb2.KvChunk(
                transfer_id=request.transfer_id,
                destination_block_ids=plan.destination_block_ids,
                filled_slots=plan.filled_slots,
            )
            if sent.path == "pool":  # the destination copies them from this pool
                chunk.source_block_ids[:] = plan.source_block_ids
                nbytes = chunk_bytes(pool, plan)
            elif filled is not None:
                offset, nbytes = await filled.next()
                chunk.shm_name, chunk.shm_offset, chunk.shm_bytes = ring.name, offset, nbytes
            else:
                chunk.data = await asyncio.to_thread(read_chunk, pool, plan)
                nbytes = len(chunk.data)
            if index == 0:
                chunk.layout.CopyFrom(pool_layout(pool))
            await call.write(chunk)
            sent.bytes += nbytes
            sent.chunks += 1
        await call.done_writing()

    @staticmethod
    async def _failed(request, exc: grpc.aio.AioRpcError, context) -> None:
        """The destination's status, passed on with its address: UNAVAILABLE where it
        cannot be reached (or went away), its own code where it refused the chunks."""
        code = destination_status(exc.code(), exc.details())
        log.warning(
            "kv_send_failed",
            transfer_id=request.transfer_id,
            destination=request.destination,
            code=code.name,
            error=exc.details(),
        )
        await context.abort(
            code, f"KV transfer {request.transfer_id} to {request.destination}: {exc.details()}"
        )


def destination_status(code: grpc.StatusCode, details: str | None) -> grpc.StatusCode:
    """The code a failed transfer answers with: UNAVAILABLE where the destination went
    away or could not be reached, the destination's own code where it refused."""
    # UNKNOWN too: grpc's "Stream removed" when the destination's stream vanished. The
    # destination itself never answers INTERNAL (receiver.py aborts with
    # FAILED_PRECONDITION or INVALID_ARGUMENT).
    gone = connection_broke(code, details) or code == grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.UNAVAILABLE if gone else code
