"""SendKv, the source's side: read the blocks a chunk at a time and stream them to the
destination's ReceiveKv.

Each chunk's blocks are copied out of the pool on a thread of their own, beside the
steps and without the runner's lock: the scheduler sends only the blocks of a request
it has parked and settled (no plan in flight or to come writes them until SendKv has
answered), and a block it shares with other requests is a full prefix block, which
nobody writes. A step thus never waits for a send, nor a send for a step (it did, for a
whole step at each end, when the copies took the lock). Turning the copy into bytes, and
sending it, happen on the same thread hop; gRPC's flow control paces the reads, so about
one chunk is held in memory at once.

Worker-to-worker channels are plaintext, one per destination address, kept for the next
transfer. A destination started with --tls-cert cannot be reached by them (the call fails
with UNAVAILABLE naming the address): TLS between workers is not supported yet.
"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2, worker_pb2_grpc
from common.grpc_options import channel_options
from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import (
    ChunkPlan,
    TransferError,
    blocks_to_bytes,
    gather_blocks,
    holds_memory,
    plan_chunks,
    pool_layout,
)

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


class KvSender:
    def __init__(self) -> None:
        self.channels = DestinationChannels()
        # Sends in progress: while any is, the servicer runs no step on the event loop,
        # which would hold each chunk for a whole step (servicer.runs_inline).
        self.active = 0

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
        sent = {"bytes": 0, "chunks": 0}

        async def chunks():
            for plan in plans:
                if CHUNK_PAUSE_S:
                    await asyncio.sleep(CHUNK_PAUSE_S)
                data = await asyncio.to_thread(read_chunk, pool, plan)
                chunk = worker_pb2.KvChunk(
                    transfer_id=request.transfer_id,
                    destination_block_ids=plan.destination_block_ids,
                    filled_slots=plan.filled_slots,
                    data=data,
                )
                if sent["chunks"] == 0:
                    chunk.layout.CopyFrom(pool_layout(pool))
                sent["bytes"] += len(data)
                sent["chunks"] += 1
                yield chunk

        stub = self.channels.stub(request.destination)
        try:
            await stub.ReceiveKv(chunks(), timeout=context.time_remaining())
        except grpc.aio.AioRpcError as exc:
            await self._failed(request, exc, context)
        seconds = time.perf_counter() - started
        log.info(
            "kv_sent",
            transfer_id=request.transfer_id,
            destination=request.destination,
            blocks=sum(len(p.source_block_ids) for p in plans),
            tokens=request.num_tokens,
            bytes=sent["bytes"],
            chunks=sent["chunks"],
            seconds=round(seconds, 4),
        )
        return worker_pb2.SendKvReply(
            bytes_sent=sent["bytes"], num_chunks=sent["chunks"], seconds=seconds
        )

    @staticmethod
    async def _failed(request, exc: grpc.aio.AioRpcError, context) -> None:
        """The destination's status, passed on with its address: UNAVAILABLE where it
        cannot be reached (or went away), its own code where it refused the chunks."""
        code = exc.code()
        if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
            code = grpc.StatusCode.UNAVAILABLE
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
