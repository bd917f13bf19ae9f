"""Seeded sampling, streaming deltas, chat, model info: through real processes."""

from __future__ import annotations

import asyncio
import contextlib
import time

from cbserve.client import AsyncClient, Completion

SEEDED = {
    "temperature": 0.9,
    "top_p": 0.95,
    "top_k": 50,
    "seed": 1234,
    "max_tokens": 24,
    "ignore_eos": True,
}


# The others run this many steps beyond the seeded request's 24: it joins them after
# their first token, and they are still in the batch when it ends, at any CPU speed.
OTHERS_TOKENS = 64


async def _seeded_alone_then_in_batch(address: str) -> tuple[list[int], list[int], list[int]]:
    async with AsyncClient(address) as client:
        alone = await client.complete("Tell me a story about a fox.", **SEEDED)
        started = [asyncio.Event() for _ in range(8)]
        streamed = [0] * 8

        async def other(i: int) -> None:
            async for response in client.generate(
                f"Describe a city number {i}.",
                temperature=1.0,
                max_tokens=OTHERS_TOKENS,
                ignore_eos=True,
                seed=i if i % 2 else None,
            ):
                streamed[i] += len(response.token_ids)
                started[i].set()

        batch = asyncio.gather(*(other(i) for i in range(8)))
        # The seeded request joins a step that already holds the others: each has
        # streamed a token, so each is running.
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 300)
        together = await client.complete("Tell me a story about a fox.", **SEEDED)
        others_when_done = list(streamed)
        # Their remaining tokens prove nothing here (the suite's time): cancelled, which
        # the stack must take cleanly too (the module's idle check follows).
        batch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch
        return alone.token_ids, together.token_ids, others_when_done


def test_seeded_request_same_alone_and_in_batch(stack):
    alone, together, others = asyncio.run(_seeded_alone_then_in_batch(stack.address))
    assert len(alone) == SEEDED["max_tokens"]
    assert alone == together
    # Every other request was still running when the seeded one finished.
    assert all(0 < count < OTHERS_TOKENS for count in others), others


def test_different_seeds_differ(client):
    first = client.complete("Tell me a story about a fox.", **SEEDED)
    second = client.complete("Tell me a story about a fox.", **{**SEEDED, "seed": 99})
    assert first.token_ids != second.token_ids


def test_stream_deltas_concatenate_and_arrive_early(client, tokenizer):
    start = time.monotonic()
    arrivals: list[float] = []
    completion = Completion()
    for response in client.generate(
        "Count from one to fifty in words:", temperature=0.0, max_tokens=64, ignore_eos=True
    ):
        arrivals.append(time.monotonic() - start)
        completion.add(response)
    assert completion.usage.completion_tokens == 64
    assert completion.text == tokenizer.decode(completion.token_ids)
    # One message per step: the first token is streamed long before the last is computed.
    assert len(arrivals) >= 32
    assert arrivals[0] < 0.5 * arrivals[-1]


def test_chat_answers_capital_of_france(client):
    completion = client.complete(
        chat=[("user", "What is the capital of France?")], temperature=0.0, max_tokens=32
    )
    assert "Paris" in completion.text
    assert completion.finish_reason == "STOP"  # the model ends its turn with EOS
    assert "<|im_end|>" not in completion.text


def test_stop_string_is_cut_and_never_streamed(client):
    baseline = client.complete(
        "Count from one to twenty: one, two, three,", temperature=0.0, max_tokens=40
    )
    assert " six" in baseline.text, baseline.text
    pieces = [
        response.text
        for response in client.generate(
            "Count from one to twenty: one, two, three,",
            temperature=0.0,
            max_tokens=40,
            stop=[" six"],
        )
    ]
    text = "".join(pieces)
    assert text == baseline.text[: baseline.text.index(" six")]
    assert not any("six" in piece for piece in pieces)


def test_logprobs_returned_per_token(client):
    completion = client.complete("The sky is", temperature=0.0, max_tokens=5, logprobs=3)
    assert len(completion.logprobs) == len(completion.token_ids) == 5
    for token_id, entry in zip(completion.token_ids, completion.logprobs, strict=True):
        assert entry.token_id == token_id
        assert len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert entry.top_logprobs[0].token_id == token_id
        assert entry.logprob <= 0.0


def test_model_info(client):
    info = client.model_info()
    assert info.vocab_size == 49152
    assert info.max_model_len == 8192
    assert list(info.eos_token_ids) == [2]
    assert info.block_size == 16
    assert info.kv_capacity_tokens > 0 and info.kv_capacity_tokens % 16 == 0
    assert info.num_workers == 1
