"""The OpenAI-compatible HTTP front, through the official `openai` package, on a real
stack: chat and completions, streamed and not, sync and async, logprobs, n, stop
strings, usage; and greedy text over HTTP equal to greedy text over gRPC."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx2 as httpx
import openai
import pytest

from cbserve.client import Client
from cbserve.local_stack import free_port
from common.metrics import parse_samples

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]
TOKENS = 12
GREEDY = {"temperature": 0.0, "max_tokens": TOKENS}


@pytest.fixture(scope="module")
def base_url(http_base_url) -> str:
    return http_base_url


@pytest.fixture(scope="module")
def api(openai_api):
    return openai_api


def test_greedy_completion_over_http_equals_grpc(http_stack, api):
    over_http = api.completions.create(model="any", prompt=PROMPT, **GREEDY)
    with Client(http_stack.address) as grpc_client:
        over_grpc = grpc_client.complete(PROMPT, temperature=0.0, max_tokens=TOKENS)
    [choice] = over_http.choices
    assert choice.text == over_grpc.text and choice.text
    assert choice.finish_reason == over_grpc.finish_reason.lower()
    assert over_http.id == f"cmpl-{over_http.id.removeprefix('cmpl-')}"
    assert over_http.object == "text_completion"
    assert over_http.usage.prompt_tokens == over_grpc.usage.prompt_tokens
    assert over_http.usage.completion_tokens == over_grpc.usage.completion_tokens == TOKENS
    assert over_http.usage.total_tokens == over_grpc.usage.prompt_tokens + TOKENS


def test_greedy_chat_over_http_equals_grpc(http_stack, api):
    over_http = api.chat.completions.create(model="any", messages=CHAT, **GREEDY)
    with Client(http_stack.address) as grpc_client:
        over_grpc = grpc_client.complete(
            chat=[(m["role"], m["content"]) for m in CHAT], temperature=0.0, max_tokens=TOKENS
        )
    [choice] = over_http.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == over_grpc.text and over_grpc.text
    assert over_http.id.startswith("chatcmpl-") and over_http.object == "chat.completion"
    # The same prompt again: its full blocks come from the prefix cache.
    again = api.chat.completions.create(model="any", messages=CHAT, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
    assert again.usage.prompt_tokens == over_grpc.usage.prompt_tokens


def test_streamed_chat_with_usage_equals_the_whole_answer(api):
    whole = api.chat.completions.create(model="any", messages=CHAT, **GREEDY)
    chunks = list(
        api.chat.completions.create(
            model="any",
            messages=CHAT,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    *content, last = chunks
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == (
        whole.choices[0].message.content
    )
    assert content[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in content)
    assert last.choices == [] and last.usage.completion_tokens == TOKENS
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_async_client_streams_completions(base_url, api):
    whole = api.completions.create(model="any", prompt=PROMPT, **GREEDY)

    async def stream() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="unused", max_retries=0
        ) as client:
            chunks = await client.completions.create(
                model="any", prompt=PROMPT, stream=True, **GREEDY
            )
            parts = [chunk async for chunk in chunks]
            return "".join(p.choices[0].text for p in parts), parts[-1].choices[0].finish_reason

    text, finish_reason = asyncio.run(stream())
    assert text == whole.choices[0].text
    assert finish_reason == "length"


def test_chat_logprobs_list_the_top_alternatives(api):
    answer = api.chat.completions.create(
        model="any", messages=CHAT, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens == TOKENS
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the token sampled is the most likely one.
        assert entry.token == entry.top_logprobs[0].token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.logprob <= 0
    plain = api.chat.completions.create(model="any", messages=CHAT, logprobs=True, **GREEDY)
    assert all(entry.top_logprobs == [] for entry in plain.choices[0].logprobs.content)


def test_completion_logprobs(api):
    answer = api.completions.create(model="any", prompt=PROMPT, logprobs=2, **GREEDY)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == TOKENS
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert all(
        max(top.values()) == pytest.approx(lp)
        for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs, strict=True)
    )
    assert logprobs.text_offset[0] == 0


def test_stop_string_ends_the_text_before_it(api):
    whole = api.completions.create(model="any", prompt=PROMPT, **GREEDY).choices[0].text
    stop = whole.split()[2]
    stopped = api.completions.create(model="any", prompt=PROMPT, stop=[stop], **GREEDY)
    assert stopped.choices[0].text == whole[: whole.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_n_choices_differ_by_seed_and_repeat_with_it(api):
    sampled = {"temperature": 1.5, "max_tokens": 8, "seed": 7, "n": 2, "prompt": "Random words:"}
    first = api.completions.create(model="any", **sampled)
    again = api.completions.create(model="any", **sampled)
    assert [c.index for c in first.choices] == [0, 1]
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]
    # Choice i samples with seed + i.
    assert texts[0] != texts[1]
    assert first.usage.completion_tokens == 16
    single = api.completions.create(model="any", **{**sampled, "n": 1})
    assert first.usage.prompt_tokens == single.usage.prompt_tokens


def test_n_choices_stream_interleaved(api):
    chunks = list(
        api.chat.completions.create(
            model="any", messages=CHAT, n=2, stream=True, temperature=0.0, max_tokens=4
        )
    )
    by_choice: dict[int, list] = {0: [], 1: []}
    for chunk in chunks:
        [choice] = chunk.choices
        by_choice[choice.index].append(choice)
    for choices in by_choice.values():
        assert choices[0].delta.role == "assistant"
        assert choices[-1].finish_reason == "length"
    # Greedy: both choices say the same.
    texts = ["".join(c.delta.content or "" for c in choices) for choices in by_choice.values()]
    assert texts[0] == texts[1] and texts[0]


def test_request_id_header_is_the_response_id(base_url):
    response = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"messages": CHAT, "max_tokens": 2},
        headers={"X-Request-Id": "my-request-17"},
        timeout=60,
    )
    assert response.status_code == 200
    assert response.json()["id"] == "chatcmpl-my-request-17"
    assert response.headers["x-request-id"] == "my-request-17"


def test_models_health_metrics_version(http_stack, base_url, api):
    [model] = api.models.list().data
    with Client(http_stack.address) as grpc_client:
        info = grpc_client.model_info()
    assert model.id == info.model_name
    assert model.model_extra["max_model_len"] == info.max_model_len
    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 200 and health.json() == {"workers_connected": 1}
    metrics = httpx.get(f"{base_url}/metrics")
    assert metrics.status_code == 200
    assert "cbserve_kv_blocks_used" in parse_samples(metrics.text)
    version = httpx.get(f"{base_url}/version")
    assert version.status_code == 200 and version.json()["version"]


def test_scheduler_exits_when_the_http_port_is_taken(http_stack):
    result = subprocess.run(
        [sys.executable, "-m", "scheduler_svc", "--port", str(free_port())]
        + ["--http-port", str(http_stack.http_port), "--worker", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"cannot start: http port {http_stack.http_port}" in result.stderr
