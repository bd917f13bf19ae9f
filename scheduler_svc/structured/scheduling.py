"""The scheduler's calls into structured outputs: a plan row's mask, the rows of a
plan's deferred masks, the logprob of an EOS the grammar forced, and the errors for a
token the grammar refused and for a mask that never reached the sampler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from scheduler_svc.core.plan import DeferredMasks
from scheduler_svc.structured.bitmask import TokenBitmask
from scheduler_svc.structured.draft_masks import add_drafting_rows

if TYPE_CHECKING:
    from scheduler_svc.core.plan import StepPlan
    from scheduler_svc.core.request import Request, RequestError, TokenLogprob


def add_allowed_tokens(
    plan: StepPlan,
    request: Request,
    num_drafts: int = 0,
    ngram_lookup: tuple[int, int] | None = None,
) -> None:
    """Adds the mask row of a constrained request that samples in this plan (a row per
    position where it may verify num_drafts drafts: draft_masks.py).

    A row goes in the plan only when no sample of the request is pending (else it is
    deferred: deferred_masks), so its output tokens are all it has: the matcher is
    synced to them first (a no-op unless it disagrees, as after a recompute) and the
    row is the allowed next tokens.
    """
    matcher = request.structured
    assert matcher is not None and request.num_pending_samples == 1 + num_drafts, request
    if plan.allowed_tokens is None:
        plan.allowed_tokens = TokenBitmask(matcher.num_words)
    if num_drafts:
        add_drafting_rows(plan.allowed_tokens, request, num_drafts, ngram_lookup)
        return
    matcher.sync(request.output_token_ids)
    plan.allowed_tokens.add(request.seq_id, matcher)


def deferred_masks(
    step_id: int,
    deferred: Sequence[tuple[Request, int, int]],
    num_words: int,
    ngram_lookup: tuple[int, int] | None = None,
) -> DeferredMasks:
    """The rows of a plan's deferred_mask_seq_ids, once every plan before it has
    answered: each request that still runs as planned (same num_preemptions) has taken
    all its tokens but the one this plan samples, so its matcher is synced to its
    output and its row is the allowed next tokens (a row per position where it may
    verify drafts: draft_masks.py; `deferred` gives each its planned drafts). A request
    that ended or was preempted since gets no row: the worker samples it
    unconstrained and the scheduler drops that token, as any token of a request gone
    since its plan."""
    from scheduler_svc.core.request import RequestStatus

    mask = TokenBitmask(num_words)
    for request, planned_at, num_drafts in deferred:
        if request.status is not RequestStatus.RUNNING or request.num_preemptions != planned_at:
            continue
        if num_drafts:
            add_drafting_rows(mask, request, num_drafts, ngram_lookup)
            continue
        matcher = request.structured
        matcher.sync(request.output_token_ids)
        mask.add(request.seq_id, matcher)
    return DeferredMasks(step_id, mask.fill())


def mask_missing_error(step_id: int) -> RequestError:
    from scheduler_svc.core.request import RequestError

    return RequestError(
        grpc.StatusCode.UNAVAILABLE,
        f"the allowed-token mask of step {step_id} did not reach the worker's sampler "
        "in time (lost or late): the request ends rather than sample outside its "
        "structured output; retry the request",
    )


def forced_token_logprob(token_id: int) -> TokenLogprob:
    """The logprob entry of a token the mask forced (the only one allowed): logprobs
    under a constraint come from the masked logits, as in vLLM, where it has
    probability 1."""
    from scheduler_svc.core.request import TokenLogprob

    return TokenLogprob(token_id=token_id, logprob=0.0, top=((token_id, 0.0),))


def off_grammar_error(request: Request, token_id: int) -> RequestError:
    from scheduler_svc.core.request import RequestError

    matcher = request.structured
    problem = matcher.error.splitlines()[0] if matcher is not None and matcher.error else ""
    return RequestError(
        grpc.StatusCode.INTERNAL,
        f"the worker sampled token {token_id}, which the request's structured output "
        f"does not allow (a worker that ignores the allowed-token mask?) {problem}".rstrip(),
    )
