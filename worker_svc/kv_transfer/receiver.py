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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2
from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import (
    LayoutMismatch,
    TransferError,
    bytes_to_slots,
    check_chunk,
    check_layout,
    holds_memory,
    write_blocks,
)

log = structlog.get_logger("worker_svc.kv_transfer")


def write_chunk(pool: KVPool, chunk: worker_pb2.KvChunk) -> None:
    """One chunk checked (TransferError), turned into slots and written (a thread's work)."""
    check_chunk(pool, chunk)
    if holds_memory(pool):
        write_blocks(pool, tuple(chunk.destination_block_ids), bytes_to_slots(pool, chunk))


class KvReceiver:
    def __init__(self) -> None:
        # Transfers in progress: while any is, the servicer runs no step on the event
        # loop, which would hold each chunk for a whole step (servicer.runs_inline).
        self.active = 0

    async def receive(
        self, pool: KVPool, chunks: AsyncIterator[worker_pb2.KvChunk], context
    ) -> worker_pb2.ReceiveKvReply:
        self.active += 1
        try:
            return await self._receive(pool, chunks, context)
        finally:
            self.active -= 1

    async def _receive(
        self, pool: KVPool, chunks: AsyncIterator[worker_pb2.KvChunk], context
    ) -> worker_pb2.ReceiveKvReply:
        started = time.perf_counter()
        transfer_id = None
        received_bytes = received_blocks = 0
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
                await asyncio.to_thread(write_chunk, pool, chunk)
                received_bytes += len(chunk.data)
                received_blocks += len(chunk.destination_block_ids)
        except LayoutMismatch as exc:
            log.warning("kv_receive_refused", transfer_id=transfer_id, error=str(exc))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TransferError as exc:
            log.warning("kv_receive_refused", transfer_id=transfer_id, error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
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
