"""Prefill apart from decode (--prefill-worker, workers/prefill_split.py) over real gRPC
and the real step loops, with fake workers whose SendKv copies their fake KV (the
decode worker's fake checks, at every step, that a moved sequence's positions hold its
own KV: a move of the wrong blocks or too few tokens breaks its stream).

New requests go to the prefill worker, move to the decode worker once their first token
is sampled (chunked prefill too), and finish there whole; a prompt the decode worker's
prefix cache holds skips the prefill worker; a failed move recomputes on the decode
worker (never back on the prefill one); a prefill worker lost mid-prefill loses nothing.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import THE, load_tokenizer, make_request, unique_prompt

MAX_TOKENS = 12


async def _collect(handle) -> list[int]:
    tokens: list[int] = []
    while True:
        item = await asyncio.wait_for(handle.queue.get(), 20.0)
        if isinstance(item, ServiceError):
            raise item
        tokens.extend(item.new_token_ids)
        if item.finish_reason is not None:
            return tokens


async def _split_pool(config: SchedulerConfig, delay_s: float = 0.0):
    """A pool of one prefill and one decode fake worker."""
    prefill, decode = [await GrpcFakeWorker().start() for _ in range(2)]
    peers = {worker.address: worker for worker in (prefill, decode)}
    for worker in (prefill, decode):
        worker.peers, worker.delay_s = peers, delay_s
    pool = WorkerPool(config, load_tokenizer())
    pool.split.add_prefill_workers([prefill.address])
    await pool.start([decode.address, prefill.address], 5.0)
    return pool, prefill, decode


async def _stop(pool, *workers) -> None:
    await pool.stop()
    for worker in workers:
        await worker.stop()


@pytest.mark.parametrize("max_num_batched_tokens", [512, 8])
def test_requests_prefill_on_the_prefill_worker_and_decode_on_the_decode_worker(
    max_num_batched_tokens,
):
    """With a step budget of 8, the 21-token prompts are prefilled in three chunks:
    the move waits for the last one."""

    async def scenario():
        config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens)
        pool, prefill, decode = await _split_pool(config)
        on_prefill, on_decode = pool.engines[prefill.address], pool.engines[decode.address]
        prompts = [unique_prompt(21) for _ in range(4)]
        handles = [
            pool.submit(make_request(prompt=p, max_tokens=MAX_TOKENS, ignore_eos=True))
            for p in prompts
        ]
        assert all(handle.holder is on_prefill for handle in handles)
        results = await asyncio.gather(*(_collect(handle) for handle in handles))
        assert results == [[THE] * MAX_TOKENS] * len(handles)
        # Each moved once, with its KV, from the prefill worker.
        assert prefill.transfers == len(handles) and decode.transfers == 0
        assert all(handle.moved_from == [prefill.address] for handle in handles)
        # The decode worker admitted no prompt: every request came in running, with KV.
        assert on_decode.stats.prefix_cache_queries == 0
        assert on_prefill.stats.prefix_cache_queries == 21 * len(handles)
        for engine in (on_prefill, on_decode):
            assert engine.load == 0 and engine.num_used_blocks == 0
        # No stream broke: the decode worker found every moved sequence's own KV.
        assert [prefill.streams, decode.streams] == [1, 1]

        # The same prompt again: the decode worker's prefix cache holds all but its last
        # token (full moved blocks entered it), so it skips the prefill worker.
        again = pool.submit(make_request(prompt=prompts[0], max_tokens=4, ignore_eos=True))
        assert again.holder is on_decode
        assert await _collect(again) == [THE] * 4
        assert prefill.transfers == len(handles) and again.moved_from == []
        assert on_decode.stats.prefix_cache_hits == 20
        # A prompt sharing only its first block with a cached one still goes to prefill.
        other = pool.submit(make_request(prompt=prompts[1][:4] + unique_prompt(17), max_tokens=4))
        assert other.holder is on_prefill
        await _collect(other)
        await _stop(pool, prefill, decode)

    asyncio.run(scenario())


def test_a_failed_move_recomputes_on_the_decode_worker():
    async def scenario():
        pool, prefill, decode = await _split_pool(SchedulerConfig())
        prefill.send_kv_fails = grpc.StatusCode.UNAVAILABLE
        on_prefill, on_decode = pool.engines[prefill.address], pool.engines[decode.address]
        handles = [
            pool.submit(make_request(prompt=unique_prompt(9), max_tokens=8, ignore_eos=True))
            for _ in range(3)
        ]
        results = await asyncio.gather(*(_collect(handle) for handle in handles))
        assert results == [[THE] * 8] * len(handles)
        # One attempt each: recomputed on the decode worker, not back on the prefill one.
        assert prefill.transfers == len(handles)
        assert all(handle.moved_from == [] for handle in handles)
        assert on_decode.stats.prefix_cache_queries > 0
        for engine in (on_prefill, on_decode):
            assert engine.load == 0 and engine.num_used_blocks == 0
        await _stop(pool, prefill, decode)

    asyncio.run(scenario())


def test_a_prefill_worker_lost_mid_prefill_loses_nothing():
    async def scenario():
        pool, prefill, decode = await _split_pool(SchedulerConfig(max_num_batched_tokens=8))
        prefill.delay_s = 0.2  # long prefill steps: the loss lands mid-prefill
        on_prefill = pool.engines[prefill.address]
        handles = [
            pool.submit(make_request(prompt=unique_prompt(30), max_tokens=6, ignore_eos=True))
            for _ in range(2)
        ]
        streams = [asyncio.create_task(_collect(handle)) for handle in handles]
        while on_prefill.steps < 1:
            await asyncio.sleep(0.01)
        await prefill.stop()
        results = await asyncio.gather(*streams)
        assert results == [[THE] * 6] * len(handles)
        assert prefill.transfers == 0
        assert all(handle.address == decode.address for handle in handles)
        await _stop(pool, decode)

    asyncio.run(scenario())
