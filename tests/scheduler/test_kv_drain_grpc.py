"""A drain over real gRPC and the real step loops (async scheduling: a plan in flight
while a request is parked), with fake workers whose SendKv copies their fake KV: every
stream gets all its tokens once, the destination's fake worker finds each moved
sequence's own KV in its blocks (else its stream would break: a ProtocolViolation),
and a transfer that fails falls back to recompute without losing a stream."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import THE, load_tokenizer, make_request, unique_prompt

MAX_TOKENS = 30


async def _collect(handle) -> list[int]:
    tokens: list[int] = []
    while True:
        item = await asyncio.wait_for(handle.queue.get(), 20.0)
        if isinstance(item, ServiceError):
            raise item
        tokens.extend(item.new_token_ids)
        if item.finish_reason is not None:
            return tokens


@pytest.mark.parametrize("transfers_fail", [False, True])
def test_drain_mid_run_keeps_every_stream_whole(transfers_fail):
    async def scenario():
        workers = [await GrpcFakeWorker().start() for _ in range(2)]
        peers = {worker.address: worker for worker in workers}
        for worker in workers:
            worker.peers = peers
            worker.delay_s = 0.01  # steps long enough for the drain to land mid-run
        source, destination = workers
        if transfers_fail:
            source.send_kv_fails = grpc.StatusCode.UNAVAILABLE
        pool = WorkerPool(SchedulerConfig(), load_tokenizer())
        await pool.start([worker.address for worker in workers], 5.0)
        requests = [
            make_request(prompt=unique_prompt(9), max_tokens=MAX_TOKENS, ignore_eos=True)
            for _ in range(8)
        ]
        handles = [pool.submit(request) for request in requests]
        streams = [asyncio.create_task(_collect(handle)) for handle in handles]
        engine = pool.engines[source.address]
        while not any(r.num_output_tokens >= 5 for r in requests if engine.holds(r.request_id)):
            await asyncio.sleep(0.01)
        on_source = [r for r in requests if engine.holds(r.request_id)]
        assert on_source
        counts = await pool.drain(source.address)
        late = pool.submit(make_request(prompt=unique_prompt(5), max_tokens=3))
        assert late.holder is pool.engines[destination.address]
        results = await asyncio.gather(*streams)
        assert all(tokens == [THE] * MAX_TOKENS for tokens in results)
        assert engine.load == 0 and engine.scheduler.block_manager.num_used_blocks == 0
        if transfers_fail:
            assert counts.requests_moved == 0 and counts.requests_recomputed > 0
        else:
            assert counts.requests_moved > 0 and counts.requests_recomputed == 0
            assert counts.tokens_not_recomputed > 0 and counts.bytes_moved > 0
            assert source.transfers == counts.requests_moved
        drained = counts.requests_moved + counts.requests_recomputed + counts.requests_requeued
        assert drained >= 1
        # No stream broke: the destination found every moved sequence's own KV.
        assert [worker.streams for worker in workers] == [1, 1]
        await _collect(late)
        await pool.stop()
        for worker in workers:
            await worker.stop()

    asyncio.run(scenario())


def test_a_worker_shutting_down_gracefully_is_drained_with_its_kv():
    async def scenario():
        workers = [await GrpcFakeWorker().start() for _ in range(2)]
        peers = {worker.address: worker for worker in workers}
        for worker in workers:
            worker.peers, worker.delay_s = peers, 0.01
        leaving, staying = workers
        pool = WorkerPool(SchedulerConfig(), load_tokenizer())
        await pool.start([worker.address for worker in workers], 5.0)
        requests = [
            make_request(prompt=unique_prompt(9), max_tokens=MAX_TOKENS, ignore_eos=True)
            for _ in range(6)
        ]
        handles = [pool.submit(request) for request in requests]
        streams = [asyncio.create_task(_collect(handle)) for handle in handles]
        engine = pool.engines[leaving.address]
        while not any(r.num_output_tokens >= 5 for r in requests if engine.holds(r.request_id)):
            await asyncio.sleep(0.01)
        await leaving.shutting_down()  # SIGTERM: health NOT_SERVING, the stream still open
        results = await asyncio.gather(*streams)
        assert all(tokens == [THE] * MAX_TOKENS for tokens in results)
        assert leaving.transfers > 0 and engine.draining and engine.load == 0
        assert (
            pool.submit(make_request(prompt=unique_prompt(5), max_tokens=2)).holder
            is (pool.engines[staying.address])
        )
        assert [worker.streams for worker in workers] == [1, 1]
        # It exits, and comes back on its port (another instance): placed on again.
        await leaving.stop()
        await leaving.start(leaving.port)

        async def back() -> None:
            while engine.draining or not engine.connected:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(back(), 20.0)
        await pool.stop()
        for worker in workers:
            await worker.stop()

    asyncio.run(scenario())
