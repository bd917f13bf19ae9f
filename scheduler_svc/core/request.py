"""One generation request as the scheduler tracks it, and what a step returns for it."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import grpc

from cbserve.v1 import generation_pb2 as pb
from common.ngram import NgramIndex
from common.sampling_params import SamplingParams
from scheduler_svc.core.draft_record import DraftRecord
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.structured.matcher import RequestMatcher

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
    sampling: SamplingParams
    arrival_time: float = 0.0
    # Lower runs first; equal priorities run in arrival order.
    priority: int = 0
    # Time on the scheduler's clock (time.monotonic unless one is injected)
    # from which the request is dropped with DEADLINE_EXCEEDED (its gRPC deadline).
    deadline: float | None = None
    # Structured outputs: the request's grammar state, advanced with each token it
    # accepts; None for free text.
    structured: RequestMatcher | None = None
    # The LoRA adapter it generates with; None: the base model.
    adapter: AdapterInfo | None = None
    seq_id: int = field(default_factory=lambda: next(_next_seq_id), init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    # Leading tokens (prompt, then output) whose KV the worker has written, or writes in
    # a plan already sent: counted when planned, so that the next plan can be built
    # while a step runs (async scheduling, see Scheduler).
    num_computed_tokens: int = field(default=0, init=False)
    # Tokens that plans already sent will sample for it, not received yet. A decode of
    # the next plan computes such a token without its id: the worker sampled it.
    num_pending_samples: int = field(default=0, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    # Whether a plan that carried this sequence has gone out: from then on the
    # worker holds its state and must be told to drop it.
    seen_by_worker: bool = field(default=False, init=False)
    # Prompt tokens whose KV came from the prefix cache at first admission.
    cached_prompt_tokens: int = field(default=0, init=False)
    # Chained hashes of the full blocks of prompt + output (see prefix_hash).
    block_hashes: list[int] = field(default_factory=list, init=False)
    # Preemption state. A request that has not sampled a token since it was
    # last admitted cannot be a victim: every preemption is paid for by progress.
    num_preemptions: int = field(default=0, init=False)
    sampled_since_admission: bool = field(default=False, init=False)
    # Times a request behind this one in the waiting queue was admitted while
    # this one did not fit (see Scheduler, no head-of-line blocking).
    num_bypassed: int = field(default=0, init=False)
    # The scheduler ended the request with an error (deadline, does not fit).
    error: RequestError | None = field(default=None, init=False)
    # Its prompt's logprobs so far, from position 1 on, until the first output carries
    # them (core/prompt_logprobs.py); then sent, and never asked of a worker again.
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list, init=False, repr=False)
    prompt_logprobs_sent: bool = field(default=False, init=False)
    # Speculative decoding: how its drafts have fared (None until it verified one).
    draft_record: DraftRecord | None = field(default=None, init=False, repr=False)
    # A constrained request's n-grams, as the worker's lookup keeps them: its mask rows
    # follow the drafts the worker proposes (structured/draft_masks.py).
    ngram_index: NgramIndex | None = field(default=None, init=False, repr=False)

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
    def num_planned_tokens(self) -> int:
        """Its tokens once every pending sample has come: what plans may compute."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_samples

    @property
    def max_kv_tokens(self) -> int:
        """The most tokens of KV the request can hold: its prompt plus max_tokens."""
        return self.num_prompt_tokens + self.sampling.max_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def running_order(self) -> tuple[int, float, int]:
        """Sort key of the running queue: best first; victims come from the end."""
        return (self.priority, self.arrival_time, self.seq_id)

    @property
    def waiting_order(self) -> tuple[int, int, float, int]:
        """Sort key of the waiting queue: by priority, preempted ones first, then FCFS."""
        return (self.priority, 0 if self.num_preemptions else 1, self.arrival_time, self.seq_id)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


@dataclass(frozen=True)
class RequestError:
    """Why the scheduler ended a request itself; the service maps it to a gRPC status."""

    code: grpc.StatusCode
    message: str


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
    # On the request's first output, when it asked for prompt logprobs: one entry per
    # prompt token, the first one's logprob NaN (nothing predicts it); else None.
    prompt_logprobs: list[TokenLogprob] | None = None
