"""Request validation: every bad field is named, with its allowed range."""

from __future__ import annotations

import pytest

from cbserve.client import build_request
from common.defaults import default_model_path
from common.errors import InvalidArgument
from scheduler_svc.api.limits import ModelLimits
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.validation import validate_request

LIMITS = ModelLimits(max_model_len=512, vocab_size=49152, kv_capacity_tokens=400)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(default_model_path())


def _validate(tokenizer, **kwargs):
    return validate_request(build_request(**kwargs), tokenizer, LIMITS)


def test_defaults_follow_vllm_except_max_tokens(tokenizer):
    validated = _validate(tokenizer, prompt="Hello there")
    sampling = validated.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        1.0,
        1.0,
        0,
        0.0,
    )
    assert sampling.repetition_penalty == 1.0 and sampling.seed is None
    assert sampling.max_tokens == 256
    assert validated.prompt_token_ids == tuple(tokenizer.encode("Hello there"))
    assert len(validated.request_id) == 32  # assigned when empty


def test_default_max_tokens_shrinks_to_fit_the_model(tokenizer):
    validated = _validate(tokenizer, token_ids=[5] * 300)
    assert validated.sampling.max_tokens == 100  # kv capacity 400 - prompt 300


def test_explicit_max_tokens_beyond_model_length_is_refused(tokenizer):
    limits = ModelLimits(max_model_len=512, vocab_size=49152, kv_capacity_tokens=4096)
    request = build_request(token_ids=[5] * 300, max_tokens=250)
    with pytest.raises(
        InvalidArgument, match=r"sampling.max_tokens.*length 512; allowed: \[1, 212\]"
    ):
        validate_request(request, tokenizer, limits)


def test_request_beyond_kv_capacity_is_refused(tokenizer):
    with pytest.raises(InvalidArgument, match="KV cache"):
        _validate(tokenizer, token_ids=[5] * 300, max_tokens=150)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": ""}, "prompt: must not be empty"),
        ({"prompt": "x", "temperature": -1.0}, r"sampling.temperature: must be in \[0, 100\]"),
        ({"prompt": "x", "top_p": 0.0}, r"sampling.top_p: must be in \(0, 1\]"),
        ({"prompt": "x", "top_k": -5}, "sampling.top_k: must be -1, 0"),
        ({"prompt": "x", "max_tokens": 0}, "sampling.max_tokens: must be >= 1"),
        ({"prompt": "x", "min_tokens": 5, "max_tokens": 2}, r"sampling.min_tokens: must be in \[0"),
        (
            {"prompt": "x", "repetition_penalty": 2.5},
            r"sampling.repetition_penalty: must be in \(0, 2\]",
        ),
        (
            {"prompt": "x", "presence_penalty": float("inf")},
            "sampling.presence_penalty: must be a finite",
        ),
        ({"token_ids": [1, 49152]}, r"prompt_token_ids.ids\[1\]: 49152 is outside the vocabulary"),
        ({"chat": [("user", "hi"), ("robot", "x")]}, r"chat.messages\[1\].role: must be one of"),
        ({"prompt": "x", "stop_token_ids": [70000]}, r"sampling.stop_token_ids\[0\]"),
        ({"prompt": "x", "request_id": "r" * 300}, "request_id: at most 256"),
        ({"token_ids": [5] * 400}, "prompt: 400 tokens leave no room"),
    ],
)
def test_bad_fields_are_named(tokenizer, kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        _validate(tokenizer, **kwargs)


def test_chat_uses_the_model_template(tokenizer):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(default_model_path())
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    validated = _validate(tokenizer, chat=[(m["role"], m["content"]) for m in messages])
    assert list(validated.prompt_token_ids) == list(expected)
