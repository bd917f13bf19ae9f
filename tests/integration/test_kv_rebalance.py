"""Rebalance over real processes (issue 46): two one-thread float32 workers with small
pools (40 blocks of 16 tokens). Sixteen requests arrive one after another, placed in
turns: the long ones (96 tokens, greedy and seeded) all on the first worker, which
must make room as they grow, the short ones (24 tokens) on the second, which soon has
room. The first moves requests there with their KV instead of preempting them: every
reply is that of a worker with a large pool (256 blocks), moves counted > 0, none
failed. (no_leaked_blocks, conftest.py: no block held on either worker at the end.)
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.liveness import WORKER_ARGS
from tests.integration.stacks import started_stack, stop_stack

LONG_TOKENS, SHORT_TOKENS = 96, 24
# The long requests need about 7 blocks each in the end, 56 on one worker: past 40.
SMALL_POOL = ["--dtype", "float32", "--threads", "1", "--num-kv-blocks", "40"]
TOPICS = ["cat", "dog", "fox", "owl", "bee", "elk", "ant", "cow"]
# Between two requests' starts: they reach placement in order, so they take turns.
ARRIVAL_GAP_S = 0.02


def _requests() -> list[pb.GenerateRequest]:
    requests = []
    for index in range(16):
        long = index % 2 == 0
        sampling = pb.SamplingParams(max_tokens=LONG_TOKENS if long else SHORT_TOKENS)
        sampling.ignore_eos = True
        if index % 4 == 2:
            sampling.temperature, sampling.seed = 0.8, 2000 + index  # seeded
        else:
            sampling.temperature = 0.0  # greedy
        topic = TOPICS[index % len(TOPICS)]
        requests.append(
            pb.GenerateRequest(
                prompt=f"Story {index}: tell a long tale about a {topic}.", sampling=sampling
            )
        )
    return requests


async def _run(address: str) -> list[list[int]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)

        async def one(request) -> list[int]:
            tokens = []
            async for response in stub.Generate(request, timeout=300):
                tokens.extend(response.token_ids)
            return tokens

        tasks = []
        for request in _requests():
            tasks.append(asyncio.create_task(one(request)))
            await asyncio.sleep(ARRIVAL_GAP_S)
        return await asyncio.wait_for(asyncio.gather(*tasks), 300)


@pytest.mark.slow  # 43 s on 2 cores: make test-slow
def test_rebalance_under_small_pools_gives_the_replies_of_a_large_one():
    large = started_stack(num_workers=1, worker_args=WORKER_ARGS)
    try:
        reference = asyncio.run(_run(large.address))
    finally:
        stop_stack(large)
    small = started_stack(num_workers=2, worker_args=SMALL_POOL)
    try:
        results = asyncio.run(_run(small.address))
        metrics = small.metrics()
    finally:
        stop_stack(small)
    moved = metrics['cbserve_kv_rebalances_total{outcome="moved"}']
    recomputed = metrics['cbserve_kv_rebalances_total{outcome="recomputed"}']
    print(
        f"\n[rebalance] {moved:.0f} moved, {recomputed:.0f} recomputed, "
        f"{metrics['cbserve_num_preemptions_total']:.0f} preemptions, "
        f"{metrics['cbserve_kv_transfer_tokens_total']:.0f} tokens not recomputed"
    )
    for index, (got, expected) in enumerate(zip(results, reference, strict=True)):
        assert got == expected, f"request {index}"
    assert moved > 0
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == 0
    assert metrics["cbserve_kv_transfer_tokens_total"] > 0
