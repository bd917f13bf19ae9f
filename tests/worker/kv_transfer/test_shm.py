"""KV moved through shared memory between two Worker services in this process (real
gRPC on loopback, real KvSender and KvReceiver, pools of random KV): the same bytes as
over the messages, for 32- and 16-bit pools; nothing left in /dev/shm after a success,
a refusal or a cancel, nor from the moment the destination mapped the segment; a chunk
naming a segment the destination has not mapped fails with FAILED_PRECONDITION; a
destination with shared memory off gets bytes."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.kv_transfer import sender as sender_module
from worker_svc.kv_transfer.layout import (
    blocks_to_bytes,
    chunk_bytes,
    gather_blocks,
    gather_into,
    plan_chunks,
)
from worker_svc.kv_transfer.receiver import KvReceiver
from worker_svc.kv_transfer.sender import KvSender
from worker_svc.kv_transfer.shm import NAME_PREFIX, SHM_DIR

NUM_BLOCKS, BLOCK_SIZE = 40, 4
SRC = [3, 4, 5, 9, 1, 2, 20, 21, 22, 23, 30, 31, 32, 7]
DST = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 25, 26, 27, 0]
TOKENS = 13 * BLOCK_SIZE + 3  # the last block partly filled


def random_pool(dtype: torch.dtype) -> KVPool:
    spec = KVPoolSpec(num_layers=3, num_kv_heads=2, head_dim=16, block_size=BLOCK_SIZE, dtype=dtype)
    pool = KVPool(spec, NUM_BLOCKS)
    pool.cache.copy_(torch.randn(pool.cache.shape).to(dtype))
    return pool


def our_segments() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(f"{NAME_PREFIX}{os.getpid()}-")}


class KvService(worker_pb2_grpc.WorkerServicer):
    """A worker's SendKv and ReceiveKv over one pool, as servicer.py wires them."""

    def __init__(self, pool: KVPool, shm: bool = True) -> None:
        self.pool, self.sender, self.receiver = pool, KvSender(shm), KvReceiver(shm)

    async def SendKv(self, request, context):  # noqa: N802 (gRPC method name)
        return await self.sender.send(self.pool, request, context)

    async def ReceiveKv(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        return await self.receiver.receive(self.pool, request_iterator, context)


async def serve(service: KvService) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def send(source: str, destination: str, src=SRC, dst=DST, tokens=TOKENS, timeout=30):
    async with grpc.aio.insecure_channel(source) as channel:
        request = pb.SendKvRequest(
            transfer_id=1,
            destination=destination,
            source_block_ids=src,
            destination_block_ids=dst,
            num_tokens=tokens,
        )
        return await worker_pb2_grpc.WorkerStub(channel).SendKv(request, timeout=timeout)


def moved(source: KVPool, destination: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
    """The moved slots on each side, as [layers, 2, tokens, heads, dim]."""

    def slots(pool, ids):
        return pool.cache[:, :, list(ids)].flatten(2, 3)[:, :, :TOKENS]

    return slots(source, SRC), slots(destination, DST)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gather_into_is_the_chunk_bytes(dtype):
    pool = random_pool(dtype)
    for plan in plan_chunks(pool, SRC, DST, TOKENS, target_bytes=3 * 1024):
        out = torch.zeros(chunk_bytes(pool, plan), dtype=torch.uint8)
        gather_into(pool, plan, out)
        expected = blocks_to_bytes(gather_blocks(pool, plan.source_block_ids), plan.filled_slots)
        assert out.numpy().tobytes() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_shared_memory_moves_the_bytes_grpc_moves(dtype, monkeypatch):
    # Small chunks, so that the ring of three slots is reused several times.
    monkeypatch.setattr(sender_module, "plan_chunks", small_chunks)
    source = random_pool(dtype)
    over_shm, over_grpc = random_pool(dtype), random_pool(dtype)

    async def run():
        services = [KvService(source), KvService(over_shm), KvService(over_grpc, shm=False)]
        served = [await serve(s) for s in services]
        (_, a), (_, b), (_, c) = served
        try:
            shm_reply = await send(a, b)
            grpc_reply = await send(a, c)
        finally:
            for server, _ in served:
                await server.stop(None)
        return services, shm_reply, grpc_reply

    services, shm_reply, grpc_reply = asyncio.run(run())
    assert services[0].sender.transfers_by_path == {"shm": 1, "grpc": 1}
    assert services[1].receiver.shm_chunks == shm_reply.num_chunks > 3
    assert services[2].receiver.shm_chunks == 0
    assert (
        shm_reply.bytes_sent
        == grpc_reply.bytes_sent
        == TOKENS * 3 * 2 * 2 * 16 * source.cache.element_size()
    )
    sent, got_shm = moved(source, over_shm)
    _, got_grpc = moved(source, over_grpc)
    assert torch.equal(got_shm, sent) and torch.equal(got_grpc, sent)
    assert not our_segments()


def small_chunks(pool, src, dst, tokens, target_bytes=None):
    return plan_chunks(pool, src, dst, tokens, target_bytes=2 * BLOCK_SIZE * 3 * 2 * 2 * 16 * 4)


def test_a_refused_transfer_leaves_no_segment(monkeypatch):
    monkeypatch.setattr(sender_module, "plan_chunks", small_chunks)
    source, destination = random_pool(torch.float32), random_pool(torch.float16)

    async def run():
        served = [await serve(KvService(source)), await serve(KvService(destination))]
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await send(served[0][1], served[1][1])
        finally:
            for server, _ in served:
                await server.stop(None)
        return refused.value

    refused = asyncio.run(run())
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.details()
    assert not our_segments()


def test_the_segment_is_unlinked_once_mapped_and_a_cancel_leaves_none(monkeypatch):
    monkeypatch.setattr(sender_module, "plan_chunks", small_chunks)
    monkeypatch.setattr(sender_module, "CHUNK_PAUSE_S", 0.2)  # the transfer takes ~1.4 s
    source, destination = random_pool(torch.float32), random_pool(torch.float32)
    receiver_service = KvService(destination)

    async def run():
        served = [await serve(KvService(source)), await serve(receiver_service)]
        try:
            transfer = asyncio.ensure_future(send(served[0][1], served[1][1], timeout=0.7))
            await asyncio.sleep(0.5)
            # Mid-transfer: the destination has mapped and unlinked the segment, so a source
            # killed now would leave nothing in /dev/shm.
            during = our_segments()
            chunks_then = receiver_service.receiver.shm_chunks
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await transfer
            await asyncio.sleep(0.2)
        finally:
            for server, _ in served:
                await server.stop(None)
        return during, chunks_then, ended.value

    during, chunks_then, ended = asyncio.run(run())
    assert during == set() and chunks_then >= 1
    assert ended.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert not our_segments()


def test_a_chunk_in_a_segment_not_mapped_fails_naming_it():
    destination = random_pool(torch.float32)

    async def run():
        server, address = await serve(KvService(destination))
        try:
            chunk = pb.KvChunk(
                transfer_id=5,
                destination_block_ids=[1],
                filled_slots=[BLOCK_SIZE],
                shm_name=f"{NAME_PREFIX}0-missing",
                shm_offset=4096,
                shm_bytes=BLOCK_SIZE * 3 * 2 * 2 * 16 * 4,
            )
            chunk.layout.CopyFrom(
                pb.KvLayout(
                    num_layers=3,
                    block_size=BLOCK_SIZE,
                    num_kv_heads=2,
                    head_dim=16,
                    dtype="float32",
                )
            )
            async with grpc.aio.insecure_channel(address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await worker_pb2_grpc.WorkerStub(channel).ReceiveKv(iter([chunk]), timeout=10)
        finally:
            await server.stop(None)
        return failed.value

    failed = asyncio.run(run())
    assert failed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{NAME_PREFIX}0-missing" in failed.details() and "not mapped" in failed.details()
    assert "offered no shared memory" in failed.details()
