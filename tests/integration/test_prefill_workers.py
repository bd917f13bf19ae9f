"""Prefill apart from decode over real processes (issue 46, item 4): one --prefill-worker
and one --worker (decode), chunked prefill (a step budget of 32 tokens), give the same
greedy replies as two colocated workers for prompts short and long, and a repeated
prompt skips the prefill worker (the decode worker's prefix cache holds it). Every
request moved once with its KV, none recomputed, and both workers' blocks are freed
afterwards (the scheduler's per-worker gauges; no_leaked_blocks checks the total too).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.liveness import WORKER_ARGS
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle

MAX_TOKENS = 16
CHUNKED = ["--max-num-batched-tokens", "32"]
TOPICS = ["a lighthouse", "the tides", "a bakery at dawn", "mountain trains", "owls"]


def _prompts() -> list[str]:
    prompts = [f"Write one sentence about {topic}." for topic in TOPICS[:2]]
    # Past the 32-token budget: prefilled over several steps.
    prompts += [
        f"Here is a long note about {topic}. " + "It goes on and on, detail after detail. " * 8
        for topic in TOPICS[2:]
    ]
    return prompts


async def _generate(address: str, prompts: list[str]) -> list[list[int]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)

        async def one(prompt: str) -> list[int]:
            request = pb.GenerateRequest(
                prompt=prompt,
                sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
            )
            tokens: list[int] = []
            async for response in stub.Generate(request, timeout=300):
                tokens.extend(response.token_ids)
            return tokens

        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))


def _run(address: str) -> tuple[list[list[int]], list[int]]:
    """Every prompt at once, then the first long one again (a prefix-cache hit)."""
    prompts = _prompts()
    first = asyncio.run(_generate(address, prompts))
    again = asyncio.run(_generate(address, [prompts[2]]))[0]
    return first, again


@pytest.fixture(scope="module")
def colocated_stack():
    running = started_stack(num_workers=2, worker_args=WORKER_ARGS, scheduler_args=CHUNKED)
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def split_stack():
    running = started_stack(
        num_workers=2, num_prefill_workers=1, worker_args=WORKER_ARGS, scheduler_args=CHUNKED
    )
    yield running
    stop_stack(running)


def test_a_prefill_and_a_decode_worker_reply_as_two_colocated_workers(colocated_stack, split_stack):
    expected_first, expected_again = _run(colocated_stack.address)
    first, again = _run(split_stack.address)
    assert first == expected_first
    assert again == expected_again
    host = split_stack.host
    decode, prefill = (f"{host}:{port}" for port in split_stack.worker_ports)
    wait_until_idle(split_stack)
    metrics = split_stack.metrics()
    placed = {
        worker: metrics[f'cbserve_worker_requests_total{{worker="{worker}"}}']
        for worker in (decode, prefill)
    }
    moved = metrics['cbserve_kv_transfers_total{outcome="moved"}']
    print(f"\n[prefill workers] placed {placed}, moved {moved:.0f}")
    # Every new prompt went to the prefill worker and moved; the repeat went to decode.
    assert placed == {prefill: len(_prompts()), decode: 1}
    assert moved == len(_prompts())
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == 0
    assert metrics["cbserve_requests_recomputed_total"] == 0
    assert metrics["cbserve_prefix_cache_hits_total"] > 0
    for worker in (decode, prefill):
        assert metrics[f'cbserve_worker_kv_blocks_used{{worker="{worker}"}}'] == 0
