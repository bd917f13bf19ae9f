"""The scheduler's calls into structured outputs: a plan row's mask, the logprob of
an EOS the grammar forced, and the error for a token the grammar refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from scheduler_svc.structured.bitmask import TokenBitmask

if TYPE_CHECKING:
    from scheduler_svc.core.plan import StepPlan
    from scheduler_svc.core.request import Request, RequestError, TokenLogprob


def add_allowed_tokens(plan: StepPlan, request: Request) -> None:
    """Adds the mask row of a constrained request that samples in this plan.

    The scheduler plans such a request only with no sample pending, so its output
    tokens are all it has: the matcher is synced to them first (a no-op unless it
    disagrees, as after a recompute) and the row is the allowed next tokens.
    """
    matcher = request.structured
    assert matcher is not None and request.num_pending_samples == 1, request.request_id
    matcher.sync(request.output_token_ids)
    if plan.allowed_tokens is None:
        plan.allowed_tokens = TokenBitmask(matcher.num_words)
    plan.allowed_tokens.add(request.seq_id, matcher)


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
