"""Every declared architecture served by real processes over gRPC: a random checkpoint of
it (tests/worker/architectures/checkpoints.py, every weight random, windows of 8 tokens)
behind a worker and a scheduler, with a small token budget (chunked prefill), a pool
small enough to preempt, and the prefix cache on. Greedy tokens of staggered requests,
whose prompts and replies run past the window and share prefixes, equal transformers'
own `generate` (float32 on the own forward; the block path and native step are checked
against the float forward in tests/worker/architectures/)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cbserve.client import AsyncClient
from tests.integration.stacks import started_stack, stop_stack
from tests.worker.architectures.checkpoints import WINDOW, write_checkpoint

REPLY = 3 * WINDOW
# Two prompts share their first 4 windows (a prefix-cache hit for the later one).
SHARED = list(range(1000, 1000 + 4 * WINDOW))
PROMPTS = [
    SHARED + [7, 8, 9],
    [5] * 3,
    list(range(2000, 2000 + 7 * WINDOW)),
    SHARED + list(range(3000, 3000 + WINDOW)),
    list(range(4000, 4000 + 2 * WINDOW + 3)),
]
STACK_ARGS = {
    # 12 blocks of 16 hold two or three of these requests: the others wait or are preempted.
    "worker": ["--num-kv-blocks", "12", "--block-size", "16"],
    "scheduler": ["--max-num-batched-tokens", "24", "--enable-prefix-caching"],
}


@pytest.fixture(
    scope="module",
    # Mixtral's and Qwen2-MoE's serving is Qwen3-MoE's but for their declarations (and
    # Qwen2-MoE's shared expert, in the same ExpertMlp): `make test-slow` runs them. So
    # does it Llama 3 and Ministral: every other stack of make test serves a Llama-layout
    # model, and their forwards are held to transformers' in test_float_forward.py.
    params=[
        "gemma3",
        "qwen3",
        pytest.param("ministral", marks=pytest.mark.slow),
        pytest.param("llama3", marks=pytest.mark.slow),
        "qwen3_moe",
        "gpt_oss",
        pytest.param("mixtral", marks=pytest.mark.slow),
        pytest.param("qwen2_moe", marks=pytest.mark.slow),
    ],
)
def checkpoint(request, tmp_path_factory):
    from common.defaults import converted_model_dir

    directory = tmp_path_factory.mktemp(request.param) / request.param
    return request.param, write_checkpoint(request.param, directory, converted_model_dir())


def greedy_reference(directory) -> list[list[int]]:
    import transformers as hf

    model = hf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    replies = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=REPLY,
                min_new_tokens=REPLY,
                do_sample=False,
                pad_token_id=0,
            )
            replies.append(out[0, len(prompt) :].tolist())
    return replies


async def served(address: str) -> list[list[int]]:
    async with AsyncClient(address) as client:

        async def one(prompt: list[int]) -> list[int]:
            tokens: list[int] = []
            async for response in client.generate(
                token_ids=prompt, temperature=0.0, max_tokens=REPLY, ignore_eos=True, timeout=300
            ):
                tokens.extend(response.token_ids)
            return tokens

        # The first alone, so that its blocks are cached when the fourth asks for them;
        # then the rest at once, more than the pool holds.
        first = await one(PROMPTS[0])
        return [first, *await asyncio.gather(*(one(p) for p in PROMPTS[1:]))]


def serve(directory, dtype: str) -> tuple[list[list[int]], dict[str, float]]:
    stack = started_stack(
        worker_args=["--model", str(directory), "--dtype", dtype, *STACK_ARGS["worker"]],
        scheduler_args=["--tokenizer", str(directory), *STACK_ARGS["scheduler"]],
    )
    try:
        replies = asyncio.run(served(stack.address))
        metrics = stack.metrics()
    finally:
        stop_stack(stack)
    return replies, metrics


def test_float32_replies_equal_transformers_generate(checkpoint):
    name, directory = checkpoint
    replies, metrics = serve(directory, "float32")
    assert replies == greedy_reference(directory), name
    # What the run went through, so that the equality covers it.
    assert metrics["cbserve_num_preemptions_total"] > 0, metrics
    assert metrics["cbserve_prefix_cache_hits_total"] > 0, metrics
