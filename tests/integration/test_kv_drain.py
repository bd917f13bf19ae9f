"""Drain without recompute over real processes (issue 46): two one-thread float32
workers, 16 requests streaming (greedy and seeded, some with stop strings, one with
structured output), AdminService.DrainWorker on the first mid-run. Every stream is
token-identical to the same requests without a drain, the reply says nothing was
recomputed and requests moved, and the drained worker gets no request afterwards.
Then the same with a worker stopped gracefully (SIGTERM) instead: drained too.
(no_leaked_blocks, conftest.py: no block held on either worker at the end.)
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from cbserve.v1 import admin_pb2, admin_pb2_grpc
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.liveness import WORKER_ARGS
from tests.integration.stacks import started_stack, stop_stack

MAX_TOKENS = 32
AFTER_TOKENS = 4
# The run after the drain, which only shows that nothing new goes to the drained worker:
# the first 8 requests (greedy, seeded, a stop string, the structured one) are enough
# for a placement that ignored the drain to put some there; all 16 cost 5 s more.
AFTER_DRAIN_REQUESTS = 8
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TOPICS = ["cat", "dog", "fox", "owl", "bee", "elk", "ant", "cow"]


def _requests() -> list[pb.GenerateRequest]:
    requests = []
    for index in range(16):
        topic = TOPICS[index % len(TOPICS)]
        sampling = pb.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=index % 4 != 3)
        if index % 2:
            sampling.temperature, sampling.seed = 0.8, 1000 + index  # seeded
        else:
            sampling.temperature = 0.0  # greedy
        if index % 4 == 3:
            sampling.stop.append(".")  # a stop string, which may end it early
        request = pb.GenerateRequest(
            prompt=f"Request {index}: write a few sentences about a {topic}.", sampling=sampling
        )
        if index == 5:
            request.ClearField("prompt")
            request.chat.messages.add(role="user", content="Give a person as JSON.")
            request.structured_output.json_schema = json.dumps(SCHEMA)
        requests.append(request)
    return requests


@pytest.fixture(scope="module")
def drain_stack():
    """Its own stack: a drained --worker worker stays out until the scheduler restarts."""
    running = started_stack(num_workers=2, worker_args=WORKER_ARGS)
    yield running
    stop_stack(running)


async def _run(address: str, drain_address: str | None, fault=None, count: int = 16):
    """Streams the first `count` requests at once; with drain_address, drains that worker
    once each stream has AFTER_TOKENS tokens (or has ended), or calls fault() then.
    Returns each stream's (token ids, text, finish reason), the drain's reply, and the
    tokens each had then."""
    requests = _requests()[:count]
    started = [asyncio.Event() for _ in requests]
    counts = [0] * len(requests)
    # Each stream's longest wait between two responses: a drain's pause shows here.
    longest_gap = [0.0] * len(requests)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)

        async def one(index: int):
            tokens, text, finish = [], "", 0
            last = None
            async for response in stub.Generate(requests[index], timeout=300):
                now = time.monotonic()
                if last is not None:
                    longest_gap[index] = max(longest_gap[index], now - last)
                last = now
                tokens.extend(response.token_ids)
                text += response.text
                counts[index] = len(tokens)
                finish = response.finish_reason or finish
                if len(tokens) >= AFTER_TOKENS:
                    started[index].set()
            started[index].set()
            return tokens, text, finish

        tasks = [asyncio.create_task(one(index)) for index in range(len(requests))]
        reply, at_drain = None, None
        if fault is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 240)
            at_drain = list(counts)
            fault()
        if drain_address is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 240)
            at_drain = list(counts)
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            began = time.monotonic()
            reply = await admin.DrainWorker(
                admin_pb2.DrainWorkerRequest(address=drain_address), timeout=240
            )
            print(
                f"\n[drain] {reply.requests_moved} moved, {reply.requests_recomputed} "
                f"recomputed, {reply.requests_requeued} requeued; {reply.blocks_moved} blocks, "
                f"{reply.bytes_moved} bytes, {reply.tokens_not_recomputed} tokens in "
                f"{reply.seconds:.3f} s (call {time.monotonic() - began:.3f} s)"
            )
        results = await asyncio.wait_for(asyncio.gather(*tasks), 300)
    print(f"[streams] longest pause between two responses: {max(longest_gap):.3f} s")
    return results, reply, at_drain


def _placed(stack, worker: str) -> float:
    return stack.metrics().get(f'cbserve_worker_requests_total{{worker="{worker}"}}', 0.0)


def test_a_drain_mid_run_moves_every_request_with_its_kv_token_identical(drain_stack):
    address = drain_stack.address
    drained = f"{drain_stack.host}:{drain_stack.worker_ports[0]}"
    reference, _, _ = asyncio.run(_run(address, None))
    results, reply, at_drain = asyncio.run(_run(address, drained))
    assert any(count < MAX_TOKENS for count in at_drain), at_drain  # mid-run
    for index, (got, expected) in enumerate(zip(results, reference, strict=True)):
        assert got == expected, f"request {index}"
    json.loads(results[5][1])  # the structured reply is whole JSON
    assert reply.requests_recomputed == 0 and reply.requests_moved > 0
    assert reply.tokens_not_recomputed > 0 and reply.bytes_moved > 0
    metrics = drain_stack.metrics()
    assert metrics["cbserve_kv_transfer_tokens_total"] == reply.tokens_not_recomputed
    assert metrics['cbserve_kv_transfers_total{outcome="moved"}'] == reply.requests_moved
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == 0
    assert metrics["cbserve_requests_drained_total"] >= reply.requests_moved
    # Drained: nothing new goes there.
    before = _placed(drain_stack, drained)
    again, _, _ = asyncio.run(_run(address, None, count=AFTER_DRAIN_REQUESTS))
    assert again == reference[:AFTER_DRAIN_REQUESTS]
    assert _placed(drain_stack, drained) == before


@pytest.fixture(scope="module")
def shutdown_stack():
    """Its own stack: a worker of it is stopped (SIGTERM) and not brought back."""
    running = started_stack(num_workers=2, worker_args=WORKER_ARGS, grace_period_s=30.0)
    yield running
    stop_stack(running)


@pytest.mark.slow  # 13 s: make test-slow; the drain itself is tested above
def test_a_worker_stopped_gracefully_is_drained_with_its_kv_not_recomputed(shutdown_stack):
    stack = shutdown_stack
    reference, _, _ = asyncio.run(_run(stack.address, None))
    leaving = stack.workers[1].process
    results, _, at_stop = asyncio.run(_run(stack.address, None, fault=leaving.terminate))
    assert any(count < MAX_TOKENS for count in at_stop), at_stop  # mid-run
    for index, (got, expected) in enumerate(zip(results, reference, strict=True)):
        assert got == expected, f"request {index}"
    metrics = stack.metrics()
    moved = metrics['cbserve_kv_transfers_total{outcome="moved"}']
    tokens = metrics["cbserve_kv_transfer_tokens_total"]
    print(f"\n[shutdown drain] {moved:.0f} moved, {tokens:.0f} tokens not recomputed")
    assert metrics['cbserve_kv_transfers_total{outcome="moved"}'] > 0
    assert metrics['cbserve_kv_transfers_total{outcome="failed"}'] == 0
    assert metrics["cbserve_requests_recomputed_total"] == 0
