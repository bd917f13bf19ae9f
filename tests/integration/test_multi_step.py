"""Multi-step decoding on the real processes: `--num-scheduler-steps 4` streams exactly
what one plan per token does, greedy, float32.

The cases stop everywhere a plan of 4 steps can end: at max_tokens that are not a
multiple of 4, at EOS (not ignored), and at a stop string in the middle of the text;
one at a time (one stream) and all at once (a batch of decodes).
"""

from __future__ import annotations

import asyncio

import pytest

from cbserve.client import AsyncClient, Client, Completion
from tests.integration.stacks import started_stack, stop_stack

NUM_STEPS = 4
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "Why is the sky blue? Answer in one sentence.",
]


@pytest.fixture(scope="module")
def multi_step_stack():
    running = started_stack(
        worker_args=["--dtype", "float32"],
        scheduler_args=["--num-scheduler-steps", str(NUM_STEPS)],
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def cases(stack) -> list[dict]:
    """Request arguments; the stop string is a word from the middle of the one-step text."""
    chats = [[("user", question)] for question in QUESTIONS]
    # The texts to cut, all at once (a batch streams what one request does: `expected`).
    unstopped = [dict(chat=chat, max_tokens=30, ignore_eos=True) for chat in chats]
    texts = [text for _, text, _ in all_at_once(stack.address, unstopped)]
    found = []
    for index, (chat, text) in enumerate(zip(chats, texts, strict=True)):
        found.append(dict(chat=chat, max_tokens=13 + index, ignore_eos=True))
        found.append(dict(chat=chat, max_tokens=64))
        words = text.split()
        found.append(dict(chat=chat, max_tokens=30, stop=[words[len(words) // 2]]))
    return found


def steps_taken(stack) -> float:
    return sum(
        value
        for name, value in stack.metrics().items()
        if name.startswith("cbserve_step_duration_seconds_count")
    )


def one_at_a_time(address: str, cases: list[dict]) -> list[tuple]:
    with Client(address) as client:
        return [outcome(client.complete(temperature=0.0, timeout=300, **case)) for case in cases]


def all_at_once(address: str, cases: list[dict]) -> list[tuple]:
    async def run() -> list[Completion]:
        async with AsyncClient(address) as client:
            return await asyncio.gather(
                *(client.complete(temperature=0.0, timeout=300, **case) for case in cases)
            )

    return [outcome(completion) for completion in asyncio.run(run())]


def outcome(completion: Completion) -> tuple:
    assert completion.usage.completion_tokens == len(completion.token_ids)
    return completion.token_ids, completion.text, completion.finish_reason


@pytest.fixture(scope="module")
def expected(stack, cases) -> list[tuple]:
    """What one plan per token streams. All at once: batched greedy decoding streams
    what one request at a time does (test_correctness.py holds it to transformers'
    generate), and it takes a third of the time."""
    return all_at_once(stack.address, cases)


def test_the_cases_end_every_way(cases, expected):
    reasons = [reason for _, _, reason in expected]
    assert reasons.count("STOP") >= 4 and reasons.count("LENGTH") >= 4, reasons
    for (token_ids, _, reason), case in zip(expected, cases, strict=True):
        if reason == "LENGTH":
            assert len(token_ids) == case["max_tokens"]


# One stream at a time: one case of each ending (max_tokens, EOS, a stop string), each
# on another question; the batch below runs all twelve (one at a time took 23 s).
ALONE = (0, 4, 8)


def test_multi_step_streams_what_one_step_plans_stream(multi_step_stack, cases, expected):
    steps_before = steps_taken(multi_step_stack)
    alone = [cases[index] for index in ALONE]
    assert one_at_a_time(multi_step_stack.address, alone) == [expected[i] for i in ALONE]
    # Plans of up to 4 tokens: far fewer steps than tokens.
    num_tokens = sum(len(expected[index][0]) for index in ALONE)
    assert steps_taken(multi_step_stack) - steps_before < num_tokens / 2


# make test-slow (10 s): make test keeps multi-step streams against one-step plans'
# (above) and every way a multi-step case ends.
@pytest.mark.slow
def test_multi_step_batches_stream_what_one_step_plans_stream(multi_step_stack, cases, expected):
    assert all_at_once(multi_step_stack.address, cases) == expected
