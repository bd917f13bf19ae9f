"""KV copied straight out of the source's shared pool (kv_transfer/pool_read.py) between
two Worker services in this process, through the real handshake (the destination opens
/proc/PID/fd/FD of this very process and checks the nonce): the moved slots are the
source's, for 32- and 16-bit pools; an offer whose nonce does not match, or whose
/proc/PID/fd cannot be opened, falls back to the ring; SendKv answers only after the
destination copied every chunk, so the source's blocks stay its own until then."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import pytest
import torch

from tests.worker.kv_transfer.test_shm import (
    DST,
    NUM_BLOCKS,
    SRC,
    TOKENS,
    KvService,
    moved,
    our_segments,
    send,
    serve,
)
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.kv_transfer import receiver as receiver_module
from worker_svc.kv_transfer import sender as sender_module
from worker_svc.kv_transfer.pool_read import copy_chunk, paired_runs
from worker_svc.shared_kv_memory import MappedSourcePool, SharedPoolMemory

SPEC = dict(num_layers=3, num_kv_heads=2, head_dim=16, block_size=4)


def random_pool(dtype: torch.dtype, shared: bool) -> KVPool:
    pool = KVPool(KVPoolSpec(**SPEC, dtype=dtype), NUM_BLOCKS, shared=shared)
    pool.cache.copy_(torch.randn(pool.cache.shape).to(dtype))
    return pool


def transfer(source: KVPool, destination: KVPool, times: int = 1, **kwargs):
    """SendKv from a service over source to one over destination, `times` times."""

    async def run():
        services = [KvService(source), KvService(destination)]
        served = [await serve(s) for s in services]
        try:
            replies = [await send(served[0][1], served[1][1], **kwargs) for _ in range(times)]
        finally:
            for server, _ in served:
                await server.stop(None)
        return services, replies

    return asyncio.run(run())


@pytest.fixture
def small_pool_chunks(monkeypatch):
    # Three blocks a chunk, so that a transfer takes several.
    monkeypatch.setattr(sender_module, "POOL_CHUNK_TARGET_BYTES", 3 * 4 * 3 * 2 * 2 * 16 * 4)


def test_paired_runs_split_where_either_side_jumps():
    runs = list(paired_runs((3, 4, 5, 9, 10), (10, 11, 20, 21, 22), (4, 4, 4, 4, 2)))
    assert runs == [(3, 10, 8), (5, 20, 4), (9, 21, 6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_destination_copies_the_source_blocks(dtype, small_pool_chunks):
    source, destination = random_pool(dtype, shared=True), random_pool(dtype, shared=False)
    untouched = destination.cache.clone()
    services, replies = transfer(source, destination, times=2)
    assert services[0].sender.transfers_by_path == {"pool": 2, "shm": 0, "grpc": 0}
    assert services[1].receiver.shm_chunks == 0
    assert services[1].receiver.pool_chunks == 2 * replies[0].num_chunks > 2
    assert replies[0].bytes_sent == TOKENS * 3 * 2 * 2 * 16 * source.cache.element_size()
    sent, got = moved(source, destination)
    assert torch.equal(got, sent)
    others = [b for b in range(NUM_BLOCKS) if b not in DST]
    assert torch.equal(destination.cache[:, :, others], untouched[:, :, others])
    assert not our_segments()  # the ring offered beside the pool the first time: gone


@pytest.mark.parametrize("spoil", ["nonce", "pid"])
def test_a_pool_that_cannot_be_proven_falls_back_to_the_ring(spoil, monkeypatch):
    source = random_pool(torch.float32, shared=True)
    destination = random_pool(torch.float32, shared=False)
    memory = source.shared_memory
    pid, fd, nbytes, nonce = memory.offer().split(" ")
    if spoil == "nonce":
        offer = f"{pid} {fd} {nbytes} {bytes(16).hex()}"
    else:  # no such process: /proc/PID/fd/FD cannot be opened (as another container's)
        offer = f"{2**22 + 17} {fd} {nbytes} {nonce}"
    monkeypatch.setattr(memory, "offer", lambda: offer)
    services, _ = transfer(source, destination)
    assert services[0].sender.transfers_by_path == {"shm": 1, "grpc": 0}
    assert services[1].receiver.pool_chunks == 0 and services[1].receiver.shm_chunks > 0
    sent, got = moved(source, destination)
    assert torch.equal(got, sent)


def test_attach_refuses_what_it_cannot_prove():
    memory = SharedPoolMemory(8192)
    pid, fd, nbytes, nonce = memory.offer().split(" ")
    mapped = MappedSourcePool.attach(memory.offer())
    mapped.close()
    with pytest.raises(ValueError, match="nonce"):
        MappedSourcePool.attach(f"{pid} {fd} {nbytes} {'ab' * 16}")
    with pytest.raises(ValueError, match="bytes"):
        MappedSourcePool.attach(f"{pid} {fd} 4096 {nonce}")
    with pytest.raises(OSError):
        MappedSourcePool.attach(f"{pid} {fd} {nbytes} {nonce}", proc="/nonexistent")
    os.close(memory.fd)


def test_send_answers_only_after_every_chunk_was_copied(small_pool_chunks, monkeypatch):
    """The scheduler frees the source's blocks when SendKv answers (kv_moves.py): by then
    the destination has copied all of them, so a step rewriting them changes nothing."""
    source = random_pool(torch.float32, shared=True)
    destination = random_pool(torch.float32, shared=False)
    copied_at: list[float] = []

    def slow_copy(pool, chunk, source_pool):
        time.sleep(0.05)
        copy_chunk(pool, chunk, source_pool)
        copied_at.append(time.monotonic())

    monkeypatch.setattr(receiver_module, "copy_chunk", slow_copy)
    answered_at = []
    expected, _ = moved(source, destination)
    expected = expected.clone()

    async def run():
        services = [KvService(source), KvService(destination)]
        served = [await serve(s) for s in services]
        try:
            reply = await send(served[0][1], served[1][1])
            answered_at.append(time.monotonic())
            # The blocks freed and rewritten by the source's next step: the copy is done.
            source.cache[:, :, SRC] = 0
        finally:
            for server, _ in served:
                await server.stop(None)
        return reply

    reply = asyncio.run(run())
    assert len(copied_at) == reply.num_chunks > 2
    assert max(copied_at) <= answered_at[0]
    _, got = moved(source, destination)
    assert torch.equal(got, expected)  # the source's values, not the zeros written after


def pool_mappings() -> int:
    gc.collect()  # earlier tests' pools and receivers, unmapped when collected
    with open("/proc/self/maps") as maps:
        return maps.read().count("memfd:cbserve-kv-pool")


def test_a_mapping_is_kept_between_transfers_until_its_source_goes():
    source = random_pool(torch.float16, shared=True)
    destination = random_pool(torch.float16, shared=False)
    before = pool_mappings()
    services, _ = transfer(source, destination, times=3)
    pools = services[1].receiver.source_pools
    assert len(pools) == 1 and pool_mappings() == before + 1  # one mapping for the three
    os.close(source.shared_memory.fd)  # as a source that died: /proc/PID/fd/FD is gone

    async def sweep():
        pools.sweep()

    asyncio.run(sweep())  # its executor's closes done before it returns
    assert len(pools) == 0 and pool_mappings() == before
