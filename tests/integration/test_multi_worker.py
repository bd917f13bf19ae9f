"""One scheduler, two worker processes: both are used, and a repeated prompt goes back
to the worker that holds its prefix.

Which worker served a request is read from the scheduler's per-worker metrics
(cbserve_worker_requests_total{worker=...}) and from each worker's own /metrics.
The stack is the session's `two_workers` (conftest.py), which the fault tests share:
workers of one thread each (two processes spin-waiting in OpenMP on two cores are many
times slower), both connected when a test starts.
"""

from __future__ import annotations

import asyncio

from cbserve.client import AsyncClient, Client
from cbserve.local_stack import LocalStack
from tests.integration.ops import (
    GENERATION,
    SERVING,
    health_status,
    per_worker,
    scrape,
    worker_metrics_url,
)

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _addresses(stack: LocalStack) -> list[str]:
    return [f"{stack.host}:{port}" for port in stack.worker_ports]


def _placed(stack: LocalStack) -> dict[str, float]:
    samples = stack.metrics()
    return {
        worker: per_worker(samples, "cbserve_worker_requests_total", worker)
        for worker in _addresses(stack)
    }


def test_model_info_reports_both_workers(two_workers):
    with Client(two_workers.address) as client:
        info = client.model_info()
    assert info.num_workers == 2
    assert list(info.workers) == sorted(_addresses(two_workers))
    assert info.kv_capacity_tokens == 2 * 256 * info.block_size


def test_scheduler_and_workers_are_serving(two_workers):
    assert health_status(two_workers.address) == SERVING
    assert health_status(two_workers.address, GENERATION) == SERVING
    for address in _addresses(two_workers):
        assert health_status(address) == SERVING


def test_concurrent_requests_are_spread_over_both_workers(two_workers):
    before = _placed(two_workers)
    worker_urls = [worker_metrics_url(worker) for worker in two_workers.workers]
    forwards_before = [scrape(url)["cbserve_worker_forward_seconds_count"] for url in worker_urls]

    async def run_all():
        async with AsyncClient(two_workers.address) as client:
            return await asyncio.gather(
                *(
                    client.complete(f"Request {index}: name a colour.", max_tokens=6, **GREEDY)
                    for index in range(6)
                )
            )

    completions = asyncio.run(run_all())
    assert all(len(completion.token_ids) == 6 for completion in completions)
    after = _placed(two_workers)
    placed = {worker: after[worker] - before[worker] for worker in after}
    assert sum(placed.values()) == 6
    # Least loaded first: six requests at once land three and three, unless one
    # finished before the last arrived.
    assert min(placed.values()) >= 2, placed
    samples = two_workers.metrics()
    for worker in _addresses(two_workers):
        assert per_worker(samples, "cbserve_worker_connected", worker) == 1
        assert per_worker(samples, "cbserve_worker_kv_blocks_total", worker) == 256
        assert samples[f'cbserve_step_duration_seconds_count{{worker="{worker}"}}'] > 0
    for url, count_before in zip(worker_urls, forwards_before, strict=True):
        assert scrape(url)["cbserve_worker_forward_seconds_count"] > count_before


def test_a_repeated_prompt_goes_to_the_worker_holding_its_prefix(two_workers, tokenizer):
    # Long enough for several full blocks (16 tokens each).
    prompt = tokenizer.encode(
        "A long shared preamble that the prefix cache should keep. " * 8 + "Say hello."
    )
    assert len(prompt) > 64
    with Client(two_workers.address) as client:
        before = _placed(two_workers)
        first = client.complete(token_ids=prompt, max_tokens=4, **GREEDY)
        after_first = _placed(two_workers)
        (home,) = [worker for worker in after_first if after_first[worker] > before[worker]]
        # Without a hit, equal idle workers take turns; the cached prefix wins over that.
        for _ in range(2):
            again = client.complete(token_ids=prompt, max_tokens=4, **GREEDY)
            assert again.usage.cached_prompt_tokens >= 64
            assert again.token_ids == first.token_ids
    after = _placed(two_workers)
    assert after[home] - before[home] == 3
    other = next(worker for worker in after if worker != home)
    assert after[other] == before[other]
