"""Text made in the API processes (--api-processes 2) is the text a single scheduler
process makes: greedy output of the real model, detokenized, and cut by stop strings
that the edge finds (the core then ends the request with STOP).

The single-process side is the session's stack; the split one has a float32 worker of
its own. Stop strings are five characters from the middle of the reference's own text,
so that most start or end inside a token: the edge has to hold text back and cut it.
"""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import pytest

from cbserve.client import AsyncClient
from tests.integration.split import split_stack
from tests.integration.stacks import stop_stack

PROMPTS = (
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The capital of France is",
    "List three colors:",
)
MAX_TOKENS = 32
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def split_real(tmp_path_factory):
    stack = split_stack(
        tmp_path_factory.mktemp("split-text"),
        # One thread: beside the session stack's worker, two cores are not oversubscribed.
        worker_args=["--dtype", "float32", "--threads", "1"],
        http_port=0,
    )
    yield stack
    stop_stack(stack)


async def _complete_all(address: str, requests: list[dict]) -> list:
    """Every request at once (one batch on the worker: a few dozen steps in all)."""
    async with AsyncClient(address) as client:
        return await asyncio.gather(
            *(client.complete(max_tokens=MAX_TOKENS, timeout=300, **GREEDY, **r) for r in requests)
        )


async def _http_complete_all(base_url: str, requests: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/completions", json={"max_tokens": MAX_TOKENS, **GREEDY, **r})
                for r in requests
            )
        )
    return [response.json()["choices"][0] for response in responses]


def _on_both(single, split, requests: list[dict], over_http: bool = False):
    """(single process's, split's[, split's over HTTP]) completions, all run at once."""

    async def both():
        runs = [_complete_all(single.address, requests), _complete_all(split.address, requests)]
        if over_http:
            runs.append(_http_complete_all(split.http_url, requests))
        return await asyncio.gather(*runs)

    return asyncio.run(both())


def _stop_string(text: str) -> tuple[str, int]:
    """A piece of text from its middle that does not occur before, and where it starts."""
    for start in range(len(text) // 3, len(text) - 4):
        piece = text[start : start + 5]
        if piece.strip() and text.find(piece) == start:
            return piece, start
    raise AssertionError(f"no stop string to pick in {text!r}")


@pytest.fixture(scope="module")
def unstopped(stack, split_real):
    """(single process, split) completions of every prompt, no stop string."""
    return _on_both(stack, split_real, [{"prompt": prompt} for prompt in PROMPTS])


def test_greedy_tokens_and_text_are_those_of_a_single_process(unstopped):
    for prompt, single, split in zip(PROMPTS, *unstopped, strict=True):
        assert split.token_ids == single.token_ids, prompt
        assert split.text == single.text and split.finish_reason == "LENGTH"


@pytest.fixture(scope="module")
def stopped(stack, split_real, unstopped):
    """Each prompt with a stop string from its unstopped text: where the string starts,
    and the single process's, the split's and the split's HTTP completions."""
    stops = [_stop_string(full.text) for full in unstopped[0]]
    requests = [
        {"prompt": prompt, "stop": [stop]} for prompt, (stop, _) in zip(PROMPTS, stops, strict=True)
    ]
    singles, splits, over_http = _on_both(stack, split_real, requests, over_http=True)
    starts = [start for _, start in stops]
    return starts, singles, splits, over_http


def test_stop_strings_cut_the_same_text_as_a_single_process(unstopped, stopped):
    for full, start, single, split in zip(unstopped[0], *stopped[:3], strict=True):
        assert single.text == full.text[:start]
        assert split.text == single.text
        assert split.finish_reason == single.finish_reason == "STOP"
        assert split.usage.completion_tokens == single.usage.completion_tokens


def test_stop_strings_over_http_cut_the_same_text(unstopped, stopped):
    starts, _, _, over_http = stopped
    for full, start, choice in zip(unstopped[0], starts, over_http, strict=True):
        assert choice["text"] == full.text[:start]
        assert choice["finish_reason"] == "stop"
