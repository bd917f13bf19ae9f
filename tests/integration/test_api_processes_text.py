"""Text made in the API processes (--api-processes 2) is the text a single scheduler
process makes: greedy output of the real model, detokenized, and cut by stop strings
that the edge finds (the core then ends the request with STOP).

The single-process side is the session's stack; the split one has a float32 worker of
its own. Stop strings are picked from the reference's own text, mid-token where the
tokenizer allows, so that the edge has to hold text back and cut inside a token.
"""

from __future__ import annotations

import httpx2 as httpx
import pytest

from cbserve.client import Client
from tests.integration.split import split_stack
from tests.integration.stacks import stop_stack

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "List three colors:",
)
MAX_TOKENS = 40
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def split_real(tmp_path_factory):
    stack = split_stack(
        tmp_path_factory.mktemp("split-text"), worker_args=["--dtype", "float32"], http_port=0
    )
    yield stack
    stop_stack(stack)


def _complete(address: str, prompt: str, **sampling):
    with Client(address) as client:
        return client.complete(prompt, max_tokens=MAX_TOKENS, timeout=120, **GREEDY, **sampling)


def _stop_string(text: str) -> tuple[str, int]:
    """A piece of text from its middle that does not occur before, and where it starts."""
    for start in range(len(text) // 3, len(text) - 4):
        piece = text[start : start + 5]
        if piece.strip() and text.find(piece) == start:
            return piece, start
    raise AssertionError(f"no stop string to pick in {text!r}")


def test_greedy_tokens_and_text_are_those_of_a_single_process(stack, split_real):
    for prompt in PROMPTS:
        single = _complete(stack.address, prompt)
        split = _complete(split_real.address, prompt)
        assert split.token_ids == single.token_ids, prompt
        assert split.text == single.text and split.finish_reason == "LENGTH"


def test_stop_strings_cut_the_same_text_as_a_single_process(stack, split_real):
    for prompt in PROMPTS:
        full = _complete(stack.address, prompt).text
        stop, start = _stop_string(full)
        single = _complete(stack.address, prompt, stop=[stop])
        split = _complete(split_real.address, prompt, stop=[stop])
        assert single.text == full[:start], (prompt, stop)
        assert split.text == single.text, (prompt, stop)
        assert split.finish_reason == single.finish_reason == "STOP"
        assert split.usage.completion_tokens == single.usage.completion_tokens


def test_stop_strings_over_http_match_a_single_process(stack, split_real):
    prompt = PROMPTS[2]
    full = _complete(stack.address, prompt).text
    stop, start = _stop_string(full)
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "stop": [stop], **GREEDY}
    texts = []
    for running in (stack, split_real):
        url = f"{running.http_url}/v1/completions"
        choice = httpx.post(url, json=body, timeout=120).json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        texts.append(choice["text"])
    assert texts == [full[:start]] * 2
