"""Turns a GenerateRequest into token ids and sampling settings, or refuses it.

Everything a client can get wrong is caught here, before the request touches
the scheduler, and answered with INVALID_ARGUMENT naming the field and the
allowed range. What passes is guaranteed to fit the model and the KV pool.

This module keeps the order of the checks and what passes them (ValidatedRequest);
the checks themselves live by what they read: the sampling settings in
common/sampling_codec.py, the prompt, token ids or chat in api/prompt.py, the room
left for generating in api/limits.py, a structured output in structured/constraint.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument
from common.sampling_codec import sampling_from_request
from common.sampling_params import SamplingParams
from scheduler_svc.api.limits import ModelLimits, fit_max_tokens
from scheduler_svc.api.prompt import prompt_token_ids
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.core.request import Request
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.structured.compiler import CompiledGrammar
from scheduler_svc.structured.constraint import Constraint, constraint_from_proto

MAX_REQUEST_ID_CHARS = 256


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

    def to_request(
        self,
        deadline: float | None,
        grammar: CompiledGrammar | None = None,
        adapter: AdapterInfo | None = None,
    ) -> Request:
        """The scheduler's Request for it, arriving now; deadline is a time.monotonic()
        value (the call's gRPC deadline); grammar is the constraint's, compiled;
        adapter is the LoRA adapter its lora_name names (PoolView.adapter)."""
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
            adapter=adapter,
        )


def _request_id(request: pb.GenerateRequest) -> str:
    if not request.request_id:
        return uuid.uuid4().hex
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")
    return request.request_id


def validate_request(
    request: pb.GenerateRequest, tokenizer: Tokenizer, limits: ModelLimits
) -> ValidatedRequest:
    """Raises InvalidArgument; returns a request that is safe to schedule.

    The checks run cheapest first, so that a request refused for its id or its
    sampling settings costs no tokenizing."""
    request_id = _request_id(request)
    sampling = sampling_from_request(request.sampling)
    for index, token_id in enumerate(sampling.stop_token_ids):
        if token_id >= limits.vocab_size:
            raise InvalidArgument(
                f"sampling.stop_token_ids[{index}]",
                f"{token_id} is outside the vocabulary [0, {limits.vocab_size})",
            )
    prompt_ids = prompt_token_ids(request, tokenizer, limits)
    sampling = fit_max_tokens(sampling, len(prompt_ids), limits)
    constraint = constraint_from_proto(request.structured_output)
    return ValidatedRequest(request_id, tuple(prompt_ids), sampling, request.priority, constraint)
