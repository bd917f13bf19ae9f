"""POST /tokenize and /detokenize, as vLLM's: the scheduler's own tokenizer and chat
template, without running anything (vLLM's benchmark client and llm-d's tools ask them).

/tokenize takes a `prompt` (special tokens added unless `add_special_tokens` is false)
or chat `messages` (rendered by the chat template, which carries its own special
tokens: none added unless asked; `add_generation_prompt` as in transformers) and
answers `{"count", "max_model_len", "tokens"}`. /detokenize takes `tokens` and answers
`{"prompt"}`, special tokens kept (vLLM decodes them). The model name a client sends
is not checked, as on the other routes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool

from common.errors import InvalidArgument
from scheduler_svc.api.http.protocol import ChatMessage, TokenId, declared
from scheduler_svc.api.limits import ModelLimits
from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer


class TokenizeRequest(BaseModel):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one body: exactly one
    of prompt and messages."""

    model_config = ConfigDict(
        extra="ignore",
        # A null one counts as left out, as the route reads it.
        json_schema_extra={
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]
        },
    )

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = declared(array={"minItems": 1})
    # Default: true for a prompt, false for messages (the template has its own).
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    # Each id below the vocabulary's size.
    tokens: list[TokenId]


def _check_text_fits(field: str, chars: int, tokenizer: Tokenizer, max_model_len: int) -> None:
    """A text too long for any request is refused before tokenizing it, which would
    hold the event loop (the request path's bound, api/prompt.py)."""
    limit = max_model_len * tokenizer.max_token_chars
    if chars > limit:
        raise InvalidArgument(
            field, f"{chars} characters are over what the model's length could hold ({limit})"
        )


def tokenize(body: TokenizeRequest, tokenizer: Tokenizer, limits: ModelLimits) -> dict:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidArgument("prompt", "give one of prompt and messages")
    if body.prompt is not None:
        _check_text_fits("prompt", len(body.prompt), tokenizer, limits.max_model_len)
        special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = tokenizer.encode(body.prompt, add_special_tokens=special)
    else:
        turns = [ChatTurn(message.role, message.text()) for message in body.messages]
        chars = sum(len(turn.role) + len(turn.content) for turn in turns)
        _check_text_fits("messages", chars, tokenizer, limits.max_model_len)
        text = tokenizer.render_chat(turns, add_generation_prompt=body.add_generation_prompt)
        tokens = tokenizer.encode(text, add_special_tokens=bool(body.add_special_tokens))
    return {"count": len(tokens), "max_model_len": limits.max_model_len, "tokens": tokens}


def detokenize(body: DetokenizeRequest, tokenizer: Tokenizer, limits: ModelLimits) -> dict:
    for index, token in enumerate(body.tokens):
        if token >= limits.vocab_size:
            raise InvalidArgument(
                f"tokens[{index}]", f"{token} is outside the vocabulary [0, {limits.vocab_size})"
            )
    return {"prompt": tokenizer.decode(list(body.tokens), skip_special_tokens=False)}
