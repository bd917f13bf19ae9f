"""Prompt logprobs from the real processes (float32) equal transformers' own, to 1e-4:
over gRPC (prompt_logprobs) with the prefix cache on, and in chunks on the chunked
stack; over HTTP as /v1/completions' echo with logprobs (max_tokens 0 and 1, whole and
streamed) and vLLM's prompt_logprobs field."""

from __future__ import annotations

import json
import math

import httpx2 as httpx
import pytest

from cbserve.client import Client, Completion
from common.defaults import default_model_path
from scheduler_svc.api.tokenizer import Tokenizer
from tests.prompt_reference import NUM_TOP, PromptScoresReference, prompt_scores

TOLERANCE = 1e-4
TEXTS = (
    "The capital of France is Paris.",
    "The history of the river begins in the mountains, where snow melts each spring and "
    "feeds a hundred small streams. They join in the valley below, turning mills and "
    "watering orchards, until the water reaches the old stone bridge that the town built "
    "four centuries ago.",
)


def prompt_reference() -> PromptScoresReference:
    tokenizer = Tokenizer(default_model_path())
    return PromptScoresReference(
        name="integration-prompt-logprobs",
        model_path=default_model_path(),
        prompts=tuple(tuple(tokenizer.encode(text)) for text in TEXTS),
    )


@pytest.fixture(scope="module")
def scored() -> list[tuple[list[int], dict]]:
    reference = prompt_reference()
    return [(list(p), s) for p, s in zip(reference.prompts, prompt_scores(reference), strict=True)]


def _close(got: list[float], want: list[float]) -> None:
    worst = max(abs(g - w) for g, w in zip(got, want, strict=True))
    assert len(got) == len(want) and worst <= TOLERANCE, f"off by {worst:.2e}"


def _check_grpc(completion: Completion, prompt: list[int], want: dict) -> None:
    entries = completion.prompt_logprobs
    assert [e.token_id for e in entries] == prompt
    assert math.isnan(entries[0].logprob) and not entries[0].top_logprobs
    _close([e.logprob for e in entries[1:]], want["logprobs"])
    tops = [[t.logprob for t in e.top_logprobs] for e in entries[1:]]
    _close([v for row in tops for v in row], [v for row in want["top_logprobs"] for v in row])
    top_ids = [[t.token_id for t in e.top_logprobs] for e in entries[1:]]
    # An id may differ only where two alternatives tie within the tolerance.
    same = sum(a == b for a, b in zip(top_ids, want["top_ids"], strict=True))
    assert same >= len(top_ids) - 1


def _score(address: str, prompt: list[int], **sampling) -> tuple[Completion, int]:
    """The completion, and how many of its responses carried prompt logprobs."""
    completion = Completion()
    carrying = 0
    with Client(address) as client:
        for response in client.generate(token_ids=prompt, temperature=0.0, **sampling):
            carrying += bool(response.prompt_logprobs)
            completion.add(response)
    return completion, carrying


def test_grpc_prompt_logprobs_equal_transformers_and_skip_the_prefix_cache(stack, scored):
    (short, short_want), (long_prompt, long_want) = scored
    # The long prompt twice: the second time its blocks are in the prefix cache.
    for prompt, want in ((short, short_want), (long_prompt, long_want), (long_prompt, long_want)):
        completion, carrying = _score(stack.address, prompt, max_tokens=2, prompt_logprobs=NUM_TOP)
        assert carrying == 1 and len(completion.token_ids) == 2
        assert completion.usage.cached_prompt_tokens == 0
        _check_grpc(completion, prompt, want)
    plain, carrying = _score(stack.address, long_prompt, max_tokens=1)
    assert carrying == 0 and plain.usage.cached_prompt_tokens >= 32


def test_a_chunked_prefill_gives_the_same_prompt_logprobs(chunked_stack, scored):
    prompt, want = scored[1]
    assert len(prompt) > 32  # the chunked stack's budget: several chunks
    completion, carrying = _score(
        chunked_stack.address, prompt, max_tokens=1, prompt_logprobs=NUM_TOP
    )
    assert carrying == 1
    _check_grpc(completion, prompt, want)


def _post(http_stack, body: dict) -> dict:
    url = f"http://127.0.0.1:{http_stack.http_port}/v1/completions"
    response = httpx.post(url, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_echo_with_max_tokens_zero_scores_the_prompt_as_lm_eval_asks(http_stack, scored, tokenizer):
    prompt, want = scored[1]
    body = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
    answer = _post(http_stack, {**body, "prompt_logprobs": 2})
    [choice] = answer["choices"]
    assert choice["text"] == tokenizer.decode(prompt) and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) == len(logprobs["text_offset"])
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    _close(logprobs["token_logprobs"][1:], want["logprobs"])
    _close(
        [max(top.values()) for top in logprobs["top_logprobs"][1:]],
        [t[0] for t in want["top_logprobs"]],
    )
    assert answer["usage"]["completion_tokens"] == 0
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    # vLLM's field, beside: the prompt token's own logprob at each position.
    vllm = choice["prompt_logprobs"]
    assert vllm[0] is None and len(vllm) == len(prompt)
    _close([vllm[i][str(prompt[i])]["logprob"] for i in range(1, len(prompt))], want["logprobs"])


def test_streamed_echo_with_one_token_scores_the_prompt_then_the_token(
    http_stack, scored, tokenizer
):
    prompt, want = scored[0]
    body = {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0}
    whole = _post(http_stack, body)["choices"][0]
    url = f"http://127.0.0.1:{http_stack.http_port}/v1/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
    text = "".join(chunk["text"] for chunk in chunks)
    assert text == whole["text"] and text.startswith(tokenizer.decode(prompt))
    streamed = [
        v for chunk in chunks if chunk["logprobs"] for v in chunk["logprobs"]["token_logprobs"]
    ]
    assert streamed == whole["logprobs"]["token_logprobs"]
    assert len(streamed) == len(prompt) + 1 and streamed[0] is None
    _close(streamed[1 : len(prompt)], want["logprobs"])


@pytest.mark.parametrize(
    "fields, param",
    [({"prompt_logprobs": 21}, "prompt_logprobs"), ({"max_tokens": 0}, "max_tokens")],
)
def test_out_of_range_prompt_logprobs_and_max_tokens_zero_without_echo_are_400(
    http_stack, fields, param
):
    url = f"http://127.0.0.1:{http_stack.http_port}/v1/completions"
    response = httpx.post(url, json={"prompt": "hi", **fields}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
