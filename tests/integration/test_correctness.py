"""Token ids from the real processes equal transformers' own greedy generate."""

from __future__ import annotations

import asyncio

from cbserve.client import AsyncClient, Completion
from tests.integration.conftest import CHUNK_BUDGET, GREEDY_TOKENS
from tests.integration.progress import TokenProgress

# Request i is sent once the run has streamed i * STAGGER_TOKENS tokens: it joins
# while earlier ones are mid-prefill or decoding, whatever the CPU's speed.
STAGGER_TOKENS = 3


async def _staggered_greedy(address: str, prompts: list[list[int]]) -> list[list[int]]:
    progress = TokenProgress()
    async with AsyncClient(address) as client:

        async def one(index: int, prompt: list[int]) -> list[int]:
            # Staggered arrivals: requests join while earlier ones are mid-prefill or decoding.
            await progress.reached(STAGGER_TOKENS * index)
            completion = Completion()
            async for response in client.generate(
                token_ids=prompt,
                temperature=0.0,
                max_tokens=GREEDY_TOKENS,
                ignore_eos=True,
                timeout=300,
            ):
                completion.add(response)
                progress.add(len(response.token_ids))
            assert completion.finish_reason == "LENGTH"
            assert completion.usage.prompt_tokens == len(prompt)
            assert completion.usage.completion_tokens == GREEDY_TOKENS
            return completion.token_ids

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _assert_all_equal(got: list[list[int]], expected: list[list[int]], prompts) -> None:
    mismatches = [
        f"prompt {i} ({len(prompts[i])} tokens): got {g} expected {e}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True))
        if g != e
    ]
    assert not mismatches, "\n".join(mismatches)


def test_concurrent_greedy_matches_transformers(stack, prompts, reference_outputs):
    assert len({len(p) for p in prompts}) >= 12, "prompts must have different lengths"
    got = asyncio.run(_staggered_greedy(stack.address, prompts))
    _assert_all_equal(got, reference_outputs, prompts)


def test_chunked_prefill_matches_transformers(chunked_stack, prompts, reference_outputs):
    # Five of the prompts that need several chunks: a shorter one is prefilled in one
    # step, as on the unchunked stack above, and this stack computes in float32 (the
    # suite's time: all 16 took 53 s, 8 took 22 s).
    chunked = [i for i, p in enumerate(prompts) if len(p) > CHUNK_BUDGET][:5]
    assert len(chunked) == 5, "most prompts must need several chunks"
    long_prompts = [prompts[i] for i in chunked]
    got = asyncio.run(_staggered_greedy(chunked_stack.address, long_prompts))
    _assert_all_equal(got, [reference_outputs[i] for i in chunked], long_prompts)
