"""One generation request as the scheduler tracks it, and what a step returns for it."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.sampling_params import SamplingConfig

# Worker-facing sequence ids are unique in the process, so that ids from a
# dropped worker stream or another worker's scheduler can never be confused.
# They start at 1: 0 is what an unset proto field reads as.
_next_seq_id = itertools.count(1)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    # EOS, a stop token id or a stop string.
    STOP = "stop"
    # max_tokens or the model's maximum length.
    LENGTH = "length"
    # Cancelled, disconnected or failed.
    ABORT = "abort"

    def to_proto(self) -> pb.FinishReason:
        return _FINISH_REASON_PROTO[self]


_FINISH_REASON_PROTO = {
    FinishReason.STOP: pb.STOP,
    FinishReason.LENGTH: pb.LENGTH,
    FinishReason.ABORT: pb.ABORT,
}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingConfig
    arrival_time: float = 0.0
    seq_id: int = field(default_factory=lambda: next(_next_seq_id), init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    # Leading tokens (prompt, then output) whose KV the worker has written.
    num_computed_tokens: int = field(default=0, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    # Whether a plan that carried this sequence has gone out: from then on the
    # worker holds its state and must be told to drop it.
    seen_by_worker: bool = field(default=False, init=False)
    # Prompt tokens whose KV came from the prefix cache (a later issue).
    cached_prompt_tokens: int = field(default=0, init=False)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    # The most likely tokens at this position, most likely first: (token_id, logprob).
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """What one step produced for one request: a delta, as the client streams it."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    # One entry per new token when the request asked for logprobs, else empty.
    logprobs: list[TokenLogprob]
    # None until the last output of the request.
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
