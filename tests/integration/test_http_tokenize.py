"""POST /tokenize and /detokenize on the session's stack, against the model's own
tokenizer as transformers loads it: a prompt with and without special tokens, a chat
through the template with and without the generation prompt, ids back to text, and
the refusals in OpenAI's error shape."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from transformers import AutoTokenizer

from common.defaults import default_model_path

PROMPT = "The quick brown fox jumps over the lazy dog. Ünïcödé 🦊!"
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


@pytest.fixture(scope="module")
def reference():
    return AutoTokenizer.from_pretrained(default_model_path())


@pytest.fixture(scope="module")
def http(http_base_url):
    with httpx.Client(base_url=http_base_url, timeout=30) as client:
        yield client


def _ok(http, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_prompt_is_the_tokenizers_ids_with_the_models_length(http, reference):
    max_model_len = http.get("/v1/models").json()["data"][0]["max_model_len"]
    for special in (True, False):
        expected = reference(PROMPT, add_special_tokens=special)["input_ids"]
        answer = _ok(
            http, "/tokenize", {"model": "any", "prompt": PROMPT, "add_special_tokens": special}
        )
        assert answer == {
            "count": len(expected),
            "max_model_len": max_model_len,
            "tokens": expected,
        }
    # Unset: special tokens added, as vLLM does for a prompt.
    default = _ok(http, "/tokenize", {"prompt": PROMPT})["tokens"]
    assert default == reference(PROMPT)["input_ids"]


def test_messages_go_through_the_chat_template(http, reference):
    for generation_prompt in (True, False):
        expected = reference.apply_chat_template(
            CHAT, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        answer = _ok(
            http, "/tokenize", {"messages": CHAT, "add_generation_prompt": generation_prompt}
        )
        assert answer["tokens"] == list(expected) and answer["count"] == len(expected)
    with_prompt = _ok(http, "/tokenize", {"messages": CHAT})["tokens"]
    without = _ok(http, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})["tokens"]
    # The generation prompt is the assistant turn's opening, after the same chat.
    assert len(with_prompt) > len(without) and with_prompt[: len(without)] == without


def test_detokenize_is_the_tokenizers_decode_special_tokens_kept(http, reference):
    ids = reference.apply_chat_template(CHAT, tokenize=True, return_dict=False)
    answer = _ok(http, "/detokenize", {"model": "any", "tokens": list(ids)})
    assert answer == {"prompt": reference.decode(ids, skip_special_tokens=False)}
    assert "<|im_start|>" in answer["prompt"]
    tokens = _ok(http, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})["tokens"]
    assert _ok(http, "/detokenize", {"tokens": tokens})["prompt"] == PROMPT


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt"),
        ("/tokenize", {"model": "any"}, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "a"}]}, "messages[0].role"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens[1]"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_refusals_are_400_in_the_openai_shape_naming_the_field(http, path, body, param):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
