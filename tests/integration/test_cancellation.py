"""Cancelled and timed-out requests free their KV blocks at the next step.

A stack of its own with a pool of 64 blocks (1024 tokens). Each request here
needs more than half of it, so a leaked block would force preemptions or
waits; and after every test the conftest checks that the stack is idle with
no block held.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from tests.integration.stacks import started_stack, stop_stack

POOL_BLOCKS = 64
BIG_PROMPT_TOKENS = 560
BIG_MAX_TOKENS = 24
DEADLINE_S = 120


@pytest.fixture(scope="module")
def small_pool_stack():
    running = started_stack(worker_args=["--dtype", "float32", "--num-kv-blocks", str(POOL_BLOCKS)])
    yield running
    stop_stack(running)


def _big_request() -> dict:
    assert (BIG_PROMPT_TOKENS + BIG_MAX_TOKENS - 1) / 16 > POOL_BLOCKS / 2
    return {
        "token_ids": [100 + i % 5000 for i in range(BIG_PROMPT_TOKENS)],
        "max_tokens": BIG_MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def test_cancel_mid_decode_frees_blocks(small_pool_stack):
    with Client(small_pool_stack.address) as client:
        for _ in range(3):
            stream = client.generate(**_big_request())
            first = next(stream)  # prefilled, and decoding has started
            assert first.token_ids
            stream.close()  # cancels the RPC
        completion = client.complete(timeout=DEADLINE_S, **_big_request())
        assert len(completion.token_ids) == BIG_MAX_TOKENS


def test_deadline_exceeded_frees_blocks(small_pool_stack):
    with Client(small_pool_stack.address) as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.complete(timeout=0.3, **_big_request())
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        completion = client.complete(timeout=DEADLINE_S, **_big_request())
        assert len(completion.token_ids) == BIG_MAX_TOKENS


async def _cancel_while_waiting(address: str) -> tuple[int, int]:
    async with AsyncClient(address) as client:
        running = asyncio.ensure_future(client.complete(**_big_request()))
        await asyncio.sleep(0.3)
        # Does not fit beside the first: it waits, then its client gives up.
        waiting = asyncio.ensure_future(client.complete(**_big_request()))
        await asyncio.sleep(0.3)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        first = await running
        after = await client.complete(timeout=DEADLINE_S, **_big_request())
        return len(first.token_ids), len(after.token_ids)


def test_cancel_while_waiting(small_pool_stack):
    assert asyncio.run(_cancel_while_waiting(small_pool_stack.address)) == (
        BIG_MAX_TOKENS,
        BIG_MAX_TOKENS,
    )
