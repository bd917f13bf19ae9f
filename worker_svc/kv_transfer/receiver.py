"""ReceiveKv, the destination's side: check the source's layout, then write each chunk
into the blocks it names, between steps.

A chunk is checked and turned from bytes into a tensor on a thread of its own, outside
the runner's lock; only the copy into the pool holds it, up to LOCK_BATCH_BYTES of chunks
per hold, so a step waits for at most one such copy. Nothing outside the named blocks is
touched: a stream cut midway leaves those blocks' contents undefined and everything else
as it was (the scheduler then frees them and recomputes). The scheduler plans no step
that reads the blocks before the source's SendKv answered, so no step sees a
half-written one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import grpc
import structlog
import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import (
    LOCK_BATCH_BYTES,
    LayoutMismatch,
    TransferError,
    bytes_to_slots,
    check_chunk,
    check_layout,
    holds_memory,
    write_blocks,
)

log = structlog.get_logger("worker_svc.kv_transfer")


def checked_slots(pool: KVPool, chunk: worker_pb2.KvChunk) -> torch.Tensor | None:
    """One chunk checked (TransferError) and turned into slots, outside the lock (a
    thread's work); None for a pool that holds no memory."""
    check_chunk(pool, chunk)
    return bytes_to_slots(pool, chunk) if holds_memory(pool) else None


def write_all(pool: KVPool, pending: list, runner_lock: threading.Lock) -> None:
    """Chunks' slots into their blocks under one hold of the lock (LOCK_BATCH_BYTES)."""
    with runner_lock:
        for block_ids, slots in pending:
            write_blocks(pool, block_ids, slots)


class KvReceiver:
    def __init__(self, runner_lock: threading.Lock) -> None:
        self.runner_lock = runner_lock

    async def receive(
        self, pool: KVPool, chunks: AsyncIterator[worker_pb2.KvChunk], context
    ) -> worker_pb2.ReceiveKvReply:
        started = time.perf_counter()
        transfer_id = None
        received_bytes = received_blocks = 0
        # Chunks checked and converted, not yet written: written a batch at a time.
        pending: list[tuple[tuple[int, ...], torch.Tensor]] = []
        pending_bytes = 0
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
                slots = await asyncio.to_thread(checked_slots, pool, chunk)
                if slots is not None:
                    pending.append((tuple(chunk.destination_block_ids), slots))
                    pending_bytes += len(chunk.data)
                if pending_bytes >= LOCK_BATCH_BYTES:
                    await asyncio.to_thread(write_all, pool, pending, self.runner_lock)
                    pending, pending_bytes = [], 0
                received_bytes += len(chunk.data)
                received_blocks += len(chunk.destination_block_ids)
            if pending:
                await asyncio.to_thread(write_all, pool, pending, self.runner_lock)
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
