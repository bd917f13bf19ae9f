"""Cancelled and timed-out requests free their KV blocks at the next step.

A stack of its own with a pool of 64 blocks (1024 tokens). Each request here
needs more than half of it, so a leaked block would force preemptions or
waits; and after every test the conftest checks that the stack is idle with
no block held.

What must still be running when it is cancelled, or when a deadline passes, asks
for LONG_MAX_TOKENS: hundreds of decode steps, where the test needs a few RPCs and
metric scrapes, so it is caught running on any CPU (see tests/integration/progress).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from tests.integration.stacks import started_stack, stop_stack, wait_for_metric_async

POOL_BLOCKS = 64
BIG_PROMPT_TOKENS = 560
BIG_MAX_TOKENS = 24
# The most that fits the pool beside the prompt (560 + 448 = 1008 of 1024 tokens).
LONG_MAX_TOKENS = 448
# A request still waiting behind another must run at least this long after it is seen
# waiting: it asks for so many tokens that the cancel reaches it first at any speed.
WAITED_ON_TOKENS = 256
DEADLINE_S = 120


@pytest.fixture(scope="module")
def small_pool_stack():
    running = started_stack(worker_args=["--dtype", "float32", "--num-kv-blocks", str(POOL_BLOCKS)])
    yield running
    stop_stack(running)


def _big_request(max_tokens: int = BIG_MAX_TOKENS) -> dict:
    assert (BIG_PROMPT_TOKENS + BIG_MAX_TOKENS - 1) / 16 > POOL_BLOCKS / 2
    assert BIG_PROMPT_TOKENS + max_tokens <= POOL_BLOCKS * 16
    return {
        "token_ids": [100 + i % 5000 for i in range(BIG_PROMPT_TOKENS)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def test_cancel_mid_decode_frees_blocks(small_pool_stack):
    with Client(small_pool_stack.address) as client:
        for _ in range(3):
            stream = client.generate(**_big_request(LONG_MAX_TOKENS))
            first = next(stream)  # prefilled, and decoding has started
            assert first.token_ids and not first.finish_reason
            stream.close()  # cancels the RPC, hundreds of steps before its end
        completion = client.complete(timeout=DEADLINE_S, **_big_request())
        assert len(completion.token_ids) == BIG_MAX_TOKENS


def test_deadline_exceeded_frees_blocks(small_pool_stack):
    with Client(small_pool_stack.address) as client:
        with pytest.raises(grpc.RpcError) as raised:
            # 448 decode steps cannot fit in 0.3 s (0.7 ms a step, with a round trip).
            client.complete(timeout=0.3, **_big_request(LONG_MAX_TOKENS))
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        completion = client.complete(timeout=DEADLINE_S, **_big_request())
        assert len(completion.token_ids) == BIG_MAX_TOKENS


async def _cancel_while_waiting(stack) -> tuple[int, int]:
    async with AsyncClient(stack.address) as client:
        tokens: list[int] = []
        admitted = asyncio.Event()

        async def run_first() -> None:
            async for response in client.generate(**_big_request(WAITED_ON_TOKENS)):
                tokens.extend(response.token_ids)
                admitted.set()

        running = asyncio.ensure_future(run_first())
        await admitted.wait()  # it holds its blocks and decodes
        # Does not fit beside the first: it waits, then its client gives up.
        waiting = asyncio.ensure_future(client.complete(**_big_request()))
        seen = await wait_for_metric_async(stack, "cbserve_num_requests_waiting", 1)
        assert seen["cbserve_num_requests_running"] == 1 and not running.done()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await running
        after = await client.complete(timeout=DEADLINE_S, **_big_request())
        return len(tokens), len(after.token_ids)


# 23 s: make test-slow; the scheduler's own test of it stays in make test
# (tests/scheduler/test_scheduler_abort.py::test_abort_while_waiting_never_reaches_the_worker).
@pytest.mark.slow
def test_cancel_while_waiting(small_pool_stack):
    assert asyncio.run(_cancel_while_waiting(small_pool_stack)) == (
        WAITED_ON_TOKENS,
        BIG_MAX_TOKENS,
    )
