"""Cancelled and timed-out requests free their KV blocks at the next step.

The chunked stack's pool holds 160 blocks. Each request here needs more than
half of it (reserved at admission), so a second one can only start once the
first one's blocks are back: a leak would make it wait forever.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from tests.integration.conftest import CHUNKED_POOL_BLOCKS

BIG_PROMPT_TOKENS = 1400
BIG_MAX_TOKENS = 48


def _big_request() -> dict:
    assert (BIG_PROMPT_TOKENS + BIG_MAX_TOKENS) / 16 > CHUNKED_POOL_BLOCKS / 2
    return {
        "token_ids": [100 + i % 5000 for i in range(BIG_PROMPT_TOKENS)],
        "max_tokens": BIG_MAX_TOKENS,
    }


def test_cancel_mid_decode_frees_blocks(chunked_stack):
    with Client(chunked_stack.address) as client:
        for _ in range(3):
            call = client.generate(ignore_eos=True, temperature=0.0, **_big_request())
            first = next(call)  # the prompt is prefilled and decoding has started
            assert first.token_ids
            call.close()  # generator close cancels the RPC
        completion = client.complete(
            ignore_eos=True, temperature=0.0, timeout=120, **_big_request()
        )
        assert len(completion.token_ids) == BIG_MAX_TOKENS


def test_deadline_exceeded_frees_blocks(chunked_stack):
    with Client(chunked_stack.address) as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.complete(ignore_eos=True, temperature=0.0, timeout=0.5, **_big_request())
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        completion = client.complete(
            ignore_eos=True, temperature=0.0, timeout=120, **_big_request()
        )
        assert len(completion.token_ids) == BIG_MAX_TOKENS


async def _cancel_while_waiting(address: str) -> int:
    async with AsyncClient(address) as client:
        running = asyncio.ensure_future(
            client.complete(ignore_eos=True, temperature=0.0, **_big_request())
        )
        await asyncio.sleep(0.5)
        # Does not fit beside the first: it waits, then its client gives up.
        waiting = asyncio.ensure_future(
            client.complete(ignore_eos=True, temperature=0.0, **_big_request())
        )
        await asyncio.sleep(0.5)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        first = await running
        after = await client.complete(
            ignore_eos=True, temperature=0.0, timeout=120, **_big_request()
        )
        assert len(first.token_ids) == BIG_MAX_TOKENS
        return len(after.token_ids)


def test_cancel_while_waiting(chunked_stack):
    assert asyncio.run(_cancel_while_waiting(chunked_stack.address)) == BIG_MAX_TOKENS
