"""A full KV pool on real processes: preemption, prefix caching, priorities, limits.

`pressure_stack` has a pool of 16 blocks (256 tokens): far too small for 16
requests at once, so they are preempted and recomputed, and must still give
exactly the tokens the big pool gives. `limits_stack` runs one request at a
time with at most two waiting, to make priorities, admission control and
deadlines observable from outside. A request that must still be running while
others queue behind it is sent ahead, waited on until it streams a token, and asks
for many more tokens than the steps the queueing takes (see
tests/integration/progress.py): no sleep decides what it is doing.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from tests.integration.prompts import mixed_prompts
from tests.integration.stacks import started_stack, stop_stack, wait_for_metric_async
from tests.waiting import wait_until_async

PRESSURE_POOL_BLOCKS = 16
BLOCK_SIZE = 16
PROMPT_CAP = 64
OUTPUT_TOKENS = 16
TIMEOUT_S = 300

GREEDY = {"temperature": 0.0, "ignore_eos": True}
# Long enough to outlive a deadline of DEADLINE_S plus a metrics poll at any speed:
# 192 steps in 0.3 s would be 1.6 ms a step, scheduler round trip included.
LONG_TOKENS = 192
DEADLINE_S = 0.2


@pytest.fixture(scope="module")
def pressure_stack():
    running = started_stack(
        worker_args=["--dtype", "float32", "--num-kv-blocks", str(PRESSURE_POOL_BLOCKS)]
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def limits_stack():
    running = started_stack(
        worker_args=["--dtype", "float32", "--num-kv-blocks", "128"],
        scheduler_args=["--max-num-seqs", "1", "--max-waiting-requests", "2"],
    )
    yield running
    stop_stack(running)


async def _complete_all(address: str, prompts: list[list[int]], max_tokens: int):
    async with AsyncClient(address) as client:
        return await asyncio.gather(
            *(
                client.complete(token_ids=p, max_tokens=max_tokens, timeout=TIMEOUT_S, **GREEDY)
                for p in prompts
            )
        )


def test_preempted_requests_give_the_tokens_of_a_big_pool(stack, pressure_stack, tokenizer):
    # 12 prompts ask for 3.5 pools' worth of slots (a pool holds 3 of them at once).
    prompts = [prompt[:PROMPT_CAP] for prompt in mixed_prompts(tokenizer, 12)]
    assert sum(len(p) + OUTPUT_TOKENS for p in prompts) > 3 * PRESSURE_POOL_BLOCKS * BLOCK_SIZE
    before = pressure_stack.metrics()["cbserve_num_preemptions_total"]

    small = asyncio.run(_complete_all(pressure_stack.address, prompts, OUTPUT_TOKENS))
    big = asyncio.run(_complete_all(stack.address, prompts, OUTPUT_TOKENS))

    assert pressure_stack.metrics()["cbserve_num_preemptions_total"] > before
    for index, (on_small, on_big) in enumerate(zip(small, big, strict=True)):
        assert len(on_small.token_ids) == OUTPUT_TOKENS, index
        assert on_small.token_ids == on_big.token_ids, f"prompt {index} diverged"
        assert on_small.finish_reason == "LENGTH"


def _shared_prefix_prompts(tokenizer) -> tuple[list[int], list[int]]:
    context = " ".join(f"Line {n}: the lighthouse keeper counts ships at dusk." for n in range(30))
    first = tokenizer.encode(f"{context}\nQuestion: how many lines are there?\nAnswer:")
    second = tokenizer.encode(f"{context}\nQuestion: what does the keeper count?\nAnswer:")
    return first, second


def test_a_shared_prefix_is_served_from_the_cache_with_the_same_tokens(
    stack, chunked_stack, tokenizer
):
    first, second = _shared_prefix_prompts(tokenizer)
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common >= 10 * BLOCK_SIZE
    hits_before = stack.metrics()["cbserve_prefix_cache_hits_total"]
    with Client(stack.address) as client:
        client.complete(token_ids=first, max_tokens=4, timeout=TIMEOUT_S, **GREEDY)
        cached = client.complete(token_ids=second, max_tokens=16, timeout=TIMEOUT_S, **GREEDY)
    with Client(chunked_stack.address) as client:
        uncached = client.complete(token_ids=second, max_tokens=16, timeout=TIMEOUT_S, **GREEDY)

    # Every whole block of the common prefix is a hit; nothing past it is.
    assert cached.usage.cached_prompt_tokens == common // BLOCK_SIZE * BLOCK_SIZE
    assert stack.metrics()["cbserve_prefix_cache_hits_total"] - hits_before >= common // 16 * 16
    assert uncached.usage.cached_prompt_tokens == 0
    assert cached.token_ids == uncached.token_ids


def test_a_prompt_repeated_whole_never_skips_its_last_token(stack, tokenizer):
    prompt = tokenizer.encode("Count the stars: one two three four five six seven eight nine ten")
    prompt = (prompt * 8)[: 4 * BLOCK_SIZE]  # exactly four full blocks
    with Client(stack.address) as client:
        first = client.complete(token_ids=prompt, max_tokens=8, timeout=TIMEOUT_S, **GREEDY)
        again = client.complete(token_ids=prompt, max_tokens=8, timeout=TIMEOUT_S, **GREEDY)
    assert again.usage.cached_prompt_tokens == 3 * BLOCK_SIZE
    assert again.token_ids == first.token_ids


async def _first_token(stream) -> tuple[list[int], asyncio.Task]:
    """Reads `stream` until its first token; the rest is read by the returned task,
    whose result is every token id."""
    tokens: list[int] = []
    started = asyncio.Event()

    async def read() -> list[int]:
        async for response in stream:
            tokens.extend(response.token_ids)
            started.set()
        return tokens

    task = asyncio.create_task(read())
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    return tokens, task


# make test-slow (16 s): priorities, preemption order and the bounded queue are checked
# on the fake worker in make test (tests/scheduler/), and preemption here above.
@pytest.mark.slow
def test_priorities_preempt_and_order_and_the_queue_is_bounded(stack, limits_stack, tokenizer):
    low, middle, high = (
        tokenizer.encode(f"Tell me a long story about {topic}.")
        for topic in ("a dragon", "a ship", "a garden")
    )
    finished: list[str] = []
    preemptions_before = limits_stack.metrics()["cbserve_num_preemptions_total"]

    async def run(client, name, prompt, priority, max_tokens):
        completion = await client.complete(
            token_ids=prompt, max_tokens=max_tokens, priority=priority, timeout=TIMEOUT_S, **GREEDY
        )
        finished.append(name)
        return completion.token_ids

    async def finish_as(name: str, reader: asyncio.Task) -> list[int]:
        tokens = await reader
        finished.append(name)
        return tokens

    async def scenario():
        async with AsyncClient(limits_stack.address, retry=None) as client:
            low_stream = client.generate(
                token_ids=low, max_tokens=64, priority=10, timeout=TIMEOUT_S, **GREEDY
            )
            # Once it has streamed a token it may be preempted; its 63 more steps
            # outlast the two sends and scrapes below at any speed.
            _, low_reader = await _first_token(low_stream)
            low_task = asyncio.create_task(finish_as("low", low_reader))
            middle_task = asyncio.create_task(run(client, "middle", middle, 5, 32))
            await wait_for_metric_async(limits_stack, "cbserve_num_requests_waiting", 1)
            high_task = asyncio.create_task(run(client, "high", high, 0, 32))
            await wait_for_metric_async(limits_stack, "cbserve_num_requests_waiting", 2)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.complete(token_ids=high, max_tokens=4, timeout=TIMEOUT_S)
            return refused.value, await asyncio.gather(low_task, middle_task, high_task)

    refused, (low_done, _, _) = asyncio.run(scenario())

    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-waiting-requests" in refused.details()
    assert finished == ["high", "middle", "low"]
    assert limits_stack.metrics()["cbserve_num_preemptions_total"] > preemptions_before
    # The preempted request streamed each token once, and the same ones as alone.
    with Client(stack.address) as client:
        alone = client.complete(token_ids=low, max_tokens=64, timeout=TIMEOUT_S, **GREEDY)
    assert low_done == alone.token_ids


def test_a_deadline_removes_a_waiting_request(limits_stack, tokenizer):
    prompt = tokenizer.encode("Describe the sea in many words.")

    async def scenario():
        async with AsyncClient(limits_stack.address) as client:
            stream = client.generate(
                token_ids=prompt, max_tokens=LONG_TOKENS, timeout=TIMEOUT_S, **GREEDY
            )
            long_tokens, long_task = await _first_token(stream)  # running, and it stays so
            with pytest.raises(grpc.aio.AioRpcError) as expired:
                await client.complete(token_ids=prompt, max_tokens=4, timeout=DEADLINE_S)
            # Gone from the queue while the request ahead of it still runs.
            await wait_for_metric_async(
                limits_stack, "cbserve_num_requests_waiting", 0, timeout_s=5.0
            )
            still_running = not long_task.done()
            streamed = len(long_tokens)
            # Its tokens still come after the expiry; the rest of its 192 prove nothing
            # more (they took 16 s in the suite), so it is cancelled.
            await wait_until_async(
                "the request ahead streams after the expiry",
                lambda: len(long_tokens) > streamed + 2,
                TIMEOUT_S,
            )
            long_task.cancel()  # cancels the request on the server too
            with contextlib.suppress(asyncio.CancelledError):
                await long_task
            return expired.value, still_running

    expired, still_running = asyncio.run(scenario())
    assert expired.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert still_running
