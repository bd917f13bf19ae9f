"""The render routes on a real stack's HTTP front: the token ids a request would run
with, which are the ids generation uses (its usage's prompt_tokens, and the same
greedy text when those ids are sent as the prompt)."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from scheduler_svc.api.tokenizer import ChatTurn

PROMPT = "The capital of France is"
CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Name a color."},
]
GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def base_url(http_base_url) -> str:
    return http_base_url


def _post(base_url: str, path: str, body: dict):
    response = httpx.post(f"{base_url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_completions_render_gives_the_ids_the_completion_runs_with(base_url, tokenizer):
    [rendered] = _post(base_url, "/v1/completions/render", {"prompt": PROMPT, **GREEDY})
    ids = rendered["token_ids"]
    assert ids == tokenizer.encode(PROMPT)
    assert rendered["sampling_params"]["max_tokens"] == 8
    assert rendered["features"] is None and rendered["stream"] is False
    by_text = _post(base_url, "/v1/completions", {"prompt": PROMPT, **GREEDY})
    by_ids = _post(base_url, "/v1/completions", {"prompt": ids, **GREEDY})
    assert by_text["usage"]["prompt_tokens"] == len(ids)
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


def test_completions_render_answers_one_per_prompt(base_url, tokenizer):
    prompts = [PROMPT, "Once upon a time"]
    rendered = _post(base_url, "/v1/completions/render", {"prompt": prompts, "n": 2})
    assert [r["token_ids"] for r in rendered] == [tokenizer.encode(p) for p in prompts]
    ids = [[5, 6, 7], [8, 9]]
    rendered = _post(base_url, "/v1/completions/render", {"prompt": ids})
    assert [r["token_ids"] for r in rendered] == ids


def test_chat_render_applies_the_chat_template_as_the_chat_route_does(base_url, tokenizer):
    rendered = _post(base_url, "/v1/chat/completions/render", {"messages": CHAT, **GREEDY})
    ids = rendered["token_ids"]
    turns = [ChatTurn(m["role"], m["content"]) for m in CHAT]
    assert ids == tokenizer.encode_chat(turns, None)
    chat = _post(base_url, "/v1/chat/completions", {"messages": CHAT, **GREEDY})
    assert chat["usage"]["prompt_tokens"] == len(ids)
    # The rendered ids as a plain prompt continue exactly as the chat did.
    as_prompt = _post(base_url, "/v1/completions", {"prompt": ids, **GREEDY})
    assert as_prompt["choices"][0]["text"] == chat["choices"][0]["message"]["content"]


def test_render_refuses_what_generation_refuses(base_url):
    response = httpx.post(f"{base_url}/v1/completions/render", json={"prompt": [10**9]}, timeout=60)
    assert response.status_code == 400
    assert "outside the vocabulary" in response.json()["error"]["message"]
