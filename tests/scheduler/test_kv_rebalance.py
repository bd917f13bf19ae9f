"""Rebalance (core/rebalance.py, workers/rebalance.py): a worker whose pool is full
moves the would-be victim of a preemption, with its KV, to a worker with room. Over
real gRPC and the real step loops, with fake workers whose SendKv copies their fake
KV (the destination's fake worker checks each moved sequence's own KV is there)."""

from __future__ import annotations

import asyncio

import pytest

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.rebalance import RebalanceRule, has_room
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import THE, Harness, load_tokenizer, make_request, unique_prompt
from .test_kv_drain_grpc import _collect

MAX_TOKENS = 30
# Eight requests of 9 + 30 tokens in blocks of 4 need 80 of a worker's 64 blocks.
NUM_REQUESTS = 8


def _sample(metrics: SchedulerMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, {"model_name": "fake", **labels})
    return value or 0.0


async def _run_full_worker(num_workers: int, config: SchedulerConfig | None = None):
    """Every request on the first worker, which must make room; the streams' tokens,
    each worker's preemptions, the metrics and the workers' fakes."""
    workers = [await GrpcFakeWorker().start() for _ in range(num_workers)]
    peers = {worker.address: worker for worker in workers}
    for worker in workers:
        worker.peers = peers
        worker.delay_s = 0.005
    metrics = SchedulerMetrics("fake", requests=False)
    pool = WorkerPool(config or SchedulerConfig(), load_tokenizer(), metrics=metrics)
    await pool.start([worker.address for worker in workers], 5.0)
    full = pool.engines[workers[0].address]
    requests = [
        make_request(prompt=unique_prompt(9), max_tokens=MAX_TOKENS, ignore_eos=True)
        for _ in range(NUM_REQUESTS)
    ]
    handles = [full.submit(request) for request in requests]
    results = await asyncio.gather(*(_collect(handle) for handle in handles))
    preemptions = [pool.engines[worker.address].stats.num_preemptions for worker in workers]
    used = [
        pool.engines[worker.address].scheduler.block_manager.num_used_blocks for worker in workers
    ]
    await pool.stop()
    for worker in workers:
        await worker.stop()
    return results, preemptions, used, metrics, workers


def test_a_full_worker_moves_requests_to_one_with_room_instead_of_preempting():
    results, preemptions, used, metrics, workers = asyncio.run(_run_full_worker(2))
    assert all(tokens == [THE] * MAX_TOKENS for tokens in results)
    moved = _sample(metrics, "cbserve_kv_rebalances_total", outcome="moved")
    assert moved > 0
    assert _sample(metrics, "cbserve_kv_transfers_total", outcome="moved") >= moved
    assert _sample(metrics, "cbserve_kv_transfer_tokens_total") > 0
    assert workers[0].transfers == moved
    # Room enough on the second worker: nobody was recomputed.
    assert preemptions == [0, 0]
    assert used == [0, 0]  # freed on both sides
    # No stream broke: the destination found every moved sequence's own KV.
    assert [worker.streams for worker in workers] == [1, 1]


def test_alone_the_full_worker_preempts_as_before():
    results, preemptions, used, metrics, _ = asyncio.run(_run_full_worker(1))
    assert all(tokens == [THE] * MAX_TOKENS for tokens in results)
    assert preemptions[0] > 0
    assert _sample(metrics, "cbserve_kv_rebalances_total", outcome="moved") == 0
    assert used == [0]


def test_with_rebalance_off_the_full_worker_preempts_beside_one_with_room():
    config = SchedulerConfig(kv_rebalance=False)
    results, preemptions, used, metrics, workers = asyncio.run(_run_full_worker(2, config))
    assert all(tokens == [THE] * MAX_TOKENS for tokens in results)
    assert preemptions[0] > 0
    assert _sample(metrics, "cbserve_kv_rebalances_total", outcome="moved") == 0
    assert workers[0].transfers == 0
    assert used == [0, 0]


def test_the_rule_moves_requests_of_a_few_blocks_to_a_worker_with_room():
    source, destination = Harness(), Harness()
    request = source.add(make_request(prompt=unique_prompt(3), max_tokens=40))
    rule = RebalanceRule(min_blocks=2)
    request.num_computed_tokens = 4  # one block of KV: cheaper to recompute
    assert not rule.worth_moving(source.scheduler, request)
    request.num_computed_tokens = 5
    assert rule.worth_moving(source.scheduler, request)
    assert has_room(destination.scheduler, request)
    destination.add(make_request(prompt=unique_prompt(3), max_tokens=2))
    assert not has_room(destination.scheduler, request)  # somebody waits there
    with pytest.raises(ValueError, match="max_per_worker"):
        RebalanceRule(max_per_worker=0)
