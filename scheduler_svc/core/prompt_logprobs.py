"""A request's prompt logprobs: asked of the worker, gathered over the prefill's chunks,
and handed to the client once, with the request's first output.

The worker scores the prompt positions each step computes (a chunked prefill sends
its slices over several steps); each slice is written at its positions, so a prefill
started again (a preemption, a worker lost) overwrites what the first try had. Once
the first output carries them the request stops asking: a recompute after that (a
preemption, or a move to another worker) computes no logits for the prompt, and the
client gets nothing twice.

A prefix-cache hit has no logits, so a request that still asks takes no cached
blocks (AdmissionQueue): its whole prompt is computed, as vLLM does.
"""

from __future__ import annotations

import math

from scheduler_svc.core.plan import StepOutput
from scheduler_svc.core.request import Request, RequestOutput, TokenLogprob

# What the first prompt token gets: nothing precedes it to predict it (vLLM: None).
NO_LOGPROB = math.nan


def wants_prompt_logprobs(request: Request) -> bool:
    """Whether the request still needs its prompt scored (asked, and not sent yet)."""
    return request.sampling.prompt_logprobs is not None and not request.prompt_logprobs_sent


def prompt_logprobs_to_ask(request: Request) -> int | None:
    """What a new sequence's plan asks of the worker: the alternatives, or None."""
    return request.sampling.prompt_logprobs if wants_prompt_logprobs(request) else None


def take_prompt_logprobs(request: Request, result: StepOutput) -> None:
    """Writes the step's slice of the request's prompt logprobs at its positions."""
    scored = result.prompt_logprobs.get(request.seq_id)
    if scored is None or not wants_prompt_logprobs(request):
        return
    first = scored.first_position
    if not 1 <= first <= len(request.prompt_logprobs) + 1:
        raise RuntimeError(
            f"request {request.request_id!r}: prompt logprobs from position {first}, "
            f"but only positions 1-{len(request.prompt_logprobs)} are known"
        )
    prompt = request.prompt_token_ids
    del request.prompt_logprobs[first - 1 :]
    for offset, (logprob, top) in enumerate(zip(scored.logprobs, scored.top, strict=True)):
        request.prompt_logprobs.append(TokenLogprob(prompt[first + offset], logprob, top))


def attach_prompt_logprobs(request: Request, output: RequestOutput) -> RequestOutput:
    """The request's first output with its prompt logprobs (one entry per prompt token,
    the first with NO_LOGPROB); later outputs, and requests that did not ask, unchanged."""
    if not wants_prompt_logprobs(request):
        return output
    scored = request.prompt_logprobs
    if len(scored) != request.num_prompt_tokens - 1:
        raise RuntimeError(
            f"request {request.request_id!r}: {len(scored)} prompt logprobs for a prompt "
            f"of {request.num_prompt_tokens} tokens"
        )
    output.prompt_logprobs = [TokenLogprob(request.prompt_token_ids[0], NO_LOGPROB), *scored]
    request.prompt_logprobs = []
    request.prompt_logprobs_sent = True
    return output
