"""Turns a GenerateRequest into token ids and sampling settings, or refuses it.

Everything a client can get wrong is caught here, before the request touches
the scheduler, and answered with INVALID_ARGUMENT naming the field and the
allowed range. What passes is guaranteed to fit the model and the KV pool.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from common.sampling_codec import sampling_from_request
from common.sampling_params import SamplingParams
from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer
from scheduler_svc.core.request import Request
from scheduler_svc.structured.compiler import CompiledGrammar
from scheduler_svc.structured.constraint import Constraint, constraint_from_proto

MAX_REQUEST_ID_CHARS = 256


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int
    # KV capacity of the largest worker: a request must fit one worker whole.
    kv_capacity_tokens: int

    def __post_init__(self) -> None:
        if min(self.max_model_len, self.vocab_size, self.kv_capacity_tokens) < 1:
            raise ValueError(f"model limits must be positive: {self}")


@dataclass(frozen=True)
class ValidatedRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    # Lower runs first; any int32 is allowed.
    priority: int = 0
    # Structured outputs: compiled (GrammarCompiler, off the event loop) before the
    # request is queued, so that a bad one is refused before anything is scheduled.
    constraint: Constraint | None = None

    def to_request(self, deadline: float | None, grammar: CompiledGrammar | None = None) -> Request:
        """The scheduler's Request for it, arriving now; deadline is a time.monotonic()
        value (the call's gRPC deadline); grammar is the constraint's, compiled."""
        if (grammar is None) != (self.constraint is None):
            raise ValueError("a constrained request needs its compiled grammar, and only it")
        return Request(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            sampling=self.sampling,
            arrival_time=time.monotonic(),
            priority=self.priority,
            deadline=deadline,
            structured=grammar.new_matcher() if grammar is not None else None,
        )


def _request_id(request: pb.GenerateRequest) -> str:
    if not request.request_id:
        return uuid.uuid4().hex
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")
    return request.request_id


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


def _prompt_token_ids(
    request: pb.GenerateRequest, tokenizer: Tokenizer, limits: ModelLimits
) -> list[int]:
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
        ids = tokenizer.encode_chat(turns, _tools(request.chat))
    if not ids:
        raise InvalidArgument(kind, "must not be empty")
    return ids


def _tools(chat: pb.Chat) -> list[dict] | None:
    """The chat's tools as OpenAI `tools` entries, for the chat template."""
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


def _fit_max_tokens(
    sampling: SamplingParams, prompt_len: int, limits: ModelLimits
) -> SamplingParams:
    room = min(limits.max_model_len, limits.kv_capacity_tokens) - prompt_len
    if room < 1:
        limit = min(limits.max_model_len, limits.kv_capacity_tokens)
        raise InvalidArgument(
            "prompt",
            f"{prompt_len} tokens leave no room to generate: at most {limit - 1} prompt tokens "
            f"(the model's maximum length is {limits.max_model_len}, a worker's KV cache holds "
            f"{limits.kv_capacity_tokens} tokens)",
        )
    if sampling.max_tokens <= room:
        return sampling
    if not sampling.max_tokens_explicit:
        # The default is a convenience, not a demand: shorten it to what fits.
        return dataclasses.replace(
            sampling, max_tokens=room, min_tokens=min(sampling.min_tokens, room)
        )
    if prompt_len + sampling.max_tokens > limits.max_model_len:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"prompt ({prompt_len} tokens) plus max_tokens ({sampling.max_tokens}) exceeds "
            f"the model's maximum length {limits.max_model_len}; allowed: [1, {room}]",
        )
    raise InvalidArgument(
        "sampling.max_tokens",
        f"prompt ({prompt_len} tokens) plus max_tokens ({sampling.max_tokens}) needs "
        f"{prompt_len + sampling.max_tokens} tokens of KV cache, but a worker holds "
        f"{limits.kv_capacity_tokens}; allowed: [1, {room}]",
    )


def validate_request(
    request: pb.GenerateRequest, tokenizer: Tokenizer, limits: ModelLimits
) -> ValidatedRequest:
    """Raises InvalidArgument; returns a request that is safe to schedule."""
    request_id = _request_id(request)
    sampling = sampling_from_request(request.sampling)
    for index, token_id in enumerate(sampling.stop_token_ids):
        if token_id >= limits.vocab_size:
            raise InvalidArgument(
                f"sampling.stop_token_ids[{index}]",
                f"{token_id} is outside the vocabulary [0, {limits.vocab_size})",
            )
    prompt_ids = _prompt_token_ids(request, tokenizer, limits)
    sampling = _fit_max_tokens(sampling, len(prompt_ids), limits)
    constraint = constraint_from_proto(request.structured_output)
    return ValidatedRequest(request_id, tuple(prompt_ids), sampling, request.priority, constraint)
