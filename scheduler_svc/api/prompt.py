"""A GenerateRequest's input (a prompt, token ids, or a chat with its tools) as the
token ids the model will read, or INVALID_ARGUMENT naming what is wrong with it.

Every check that can be made before tokenizing is made first: tokenizing a text
too long to ever fit would hold the event loop for seconds, and checking millions
of ids one by one would too.
"""

from __future__ import annotations

import json

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from scheduler_svc.api.limits import ModelLimits
from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer


def prompt_token_ids(
    request: pb.GenerateRequest, tokenizer: Tokenizer, limits: ModelLimits
) -> list[int]:
    """The request's prompt as token ids, at least one, each in the vocabulary."""
    vocab_size = limits.vocab_size
    kind = request.WhichOneof("input")
    if kind is None:
        raise InvalidArgument("input", "set one of prompt, prompt_token_ids or chat")
    if kind == "prompt":
        if not request.prompt:
            raise InvalidArgument("prompt", "must not be empty")
        _check_text_fits("prompt", len(request.prompt), tokenizer, limits.max_model_len)
        ids = tokenizer.encode(request.prompt)
    elif kind == "prompt_token_ids":
        ids = list(request.prompt_token_ids.ids)
        if len(ids) >= limits.max_model_len:
            # Refused before the per-id check below, which is slow for millions of ids.
            raise InvalidArgument(
                "prompt_token_ids",
                f"{len(ids)} tokens leave no room to generate: the model's maximum length "
                f"is {limits.max_model_len}",
            )
        for index, token_id in enumerate(ids):
            if token_id >= vocab_size:
                raise InvalidArgument(
                    f"prompt_token_ids.ids[{index}]",
                    f"{token_id} is outside the vocabulary [0, {vocab_size})",
                )
    else:
        messages = request.chat.messages
        if len(messages) > limits.max_model_len:
            raise InvalidArgument(
                "chat.messages",
                f"{len(messages)} messages cannot fit the model's maximum length of "
                f"{limits.max_model_len} tokens",
            )
        chars = sum(len(m.content) + len(m.role) for m in messages)
        _check_text_fits("chat.messages", chars, tokenizer, limits.max_model_len)
        turns = [ChatTurn(m.role, m.content) for m in messages]
        # Read before the template renders: a bad tool is refused before any tokenizing.
        tools = _chat_tools(request.chat)
        ids = tokenizer.encode_chat(turns, tools)
    if not ids:
        raise InvalidArgument(kind, "must not be empty")
    return ids


def _check_text_fits(field: str, chars: int, tokenizer: Tokenizer, max_model_len: int) -> None:
    """Refuses, before tokenizing, a text too long to fit the model whatever its
    tokens: tokenizing a message-sized text would hold the event loop for seconds."""
    limit = max_model_len * tokenizer.max_token_chars
    if chars > limit:
        raise InvalidArgument(
            field,
            f"{chars} characters cannot fit the model's maximum length of {max_model_len} "
            f"tokens (at most {limit} characters)",
        )


def _chat_tools(chat: pb.Chat) -> list[dict] | None:
    """The chat's tools as OpenAI `tools` entries, for the chat template to render
    into the prompt; None when it has none, so that the template renders as without."""
    tools = []
    for index, tool in enumerate(chat.tools):
        if not tool.name:
            raise InvalidArgument(f"chat.tools[{index}].name", "must not be empty")
        function: dict = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        if tool.parameters_json:
            try:
                function["parameters"] = json.loads(tool.parameters_json)
            except json.JSONDecodeError as error:
                raise InvalidArgument(
                    f"chat.tools[{index}].parameters_json", f"is not valid JSON: {error}"
                ) from None
        tools.append({"type": "function", "function": function})
    return tools or None
