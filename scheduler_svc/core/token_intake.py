"""Taking one request's sampled tokens of a step: append, logprobs, stops, grammar.

The scheduler calls `take_output` once per request that sampled in a step's result;
`take_tokens` appends the tokens to the request in order, up to the one that ends
it, and says how it ends; the request is then ended in the scheduler's table
(request_table.py: blocks freed, the worker told) and the tokens become the output
the edge streams (without text: the edge detokenizes).

Runs once per request per step at every batch size: plain locals, no per-token
objects but a token's logprob when it is asked for.

A constrained request whose grammar, after a token, allows nothing but EOS takes
that EOS at once, without the step that could only sample it, and ends with STOP:
the tokens, text and finish reason vLLM gives after sampling the forced EOS, also
below min_tokens (where vLLM lets the EOS through, as banning it would leave no
token to sample) and with ignore_eos (past an EOS the grammar allows only more EOS).
A token that completes the grammar on max_tokens ends with LENGTH, as in vLLM.

The stop rules themselves are token_stops.py's; text and stop strings never reach
the core (output/text_stream.py at the edge).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from scheduler_svc.core.plan import SampledLogprobs, StepOutput
from scheduler_svc.core.prompt_logprobs import attach_prompt_logprobs
from scheduler_svc.core.request import (
    FinishReason,
    Request,
    RequestError,
    RequestOutput,
    TokenLogprob,
)
from scheduler_svc.core.request_table import RequestTable
from scheduler_svc.core.token_stops import StopChecker
from scheduler_svc.structured.scheduling import forced_token_logprob, off_grammar_error


class TakenTokens(NamedTuple):
    token_ids: list[int]
    logprobs: list
    # Why the request ends with these tokens; None: it goes on.
    finish_reason: FinishReason | None
    # Set when a token broke the request's grammar: it fails, that token unstreamed.
    error: RequestError | None


def take_output(
    request: Request,
    indices: list[int],
    result: StepOutput,
    requests: RequestTable,
    eos_token_ids: Sequence[int],
) -> RequestOutput | None:
    """A request's tokens of a step as one output, the request ended if they end it;
    None if it has none (its first token broke its grammar)."""
    taken = take_tokens(request, indices, result, requests.stop_checker(request), eos_token_ids)
    if taken.error is not None:
        requests.fail(request, taken.error)
    elif taken.finish_reason is not None:
        requests.finish(request, taken.finish_reason)
    if not taken.token_ids:
        return None
    request.sampled_since_admission = True
    output = RequestOutput(
        request.request_id,
        taken.token_ids,
        "",
        taken.logprobs,
        taken.finish_reason,
        len(request.prompt_token_ids),
        len(request.output_token_ids),
        request.cached_prompt_tokens,
    )
    return attach_prompt_logprobs(request, output)


def take_tokens(
    request: Request,
    indices: list[int],
    result: StepOutput,
    stop_checker: StopChecker,
    eos_token_ids: Sequence[int],
) -> TakenTokens:
    """Appends the request's tokens at these indices of result.token_ids (one per step
    of its plan) in order, up to the one that finishes it. The tokens after that one
    (later steps of a multi-step plan, or the next plan already in flight) were
    computed past its end and are never taken."""
    output_ids = request.output_token_ids
    num_prompt = len(request.prompt_token_ids)
    new_token_ids: list[int] = []
    logprobs: list = []
    wants_logprobs = request.sampling.logprobs > 0
    for index in indices:
        token_id = result.token_ids[index]
        if request.structured is not None and not request.structured.advance(token_id):
            # Only a worker that ignored the mask sends such a token: never stream it.
            return TakenTokens(new_token_ids, logprobs, None, off_grammar_error(request, token_id))
        output_ids.append(token_id)
        new_token_ids.append(token_id)
        request.num_pending_samples -= 1
        if wants_logprobs:
            logprob = token_logprob(request, token_id, result.logprobs.get(index))
            if logprob is not None:
                logprobs.append(logprob)
        reason = stop_checker.check(token_id, len(output_ids), num_prompt)
        if reason is None and request.structured is not None and request.structured.must_end:
            reason = take_forced_eos(request, eos_token_ids, new_token_ids, logprobs)
        if reason is not None:
            return TakenTokens(new_token_ids, logprobs, reason, None)
    return TakenTokens(new_token_ids, logprobs, None, None)


def token_logprob(
    request: Request, token_id: int, entry: SampledLogprobs | None
) -> TokenLogprob | None:
    """The logprob entry a request's output carries for a sampled token, if it asked."""
    if entry is None or request.sampling.logprobs == 0:
        return None
    return TokenLogprob(token_id=token_id, logprob=entry.logprob, top=entry.top)


def take_forced_eos(
    request: Request, eos_token_ids: Sequence[int], new_token_ids: list[int], logprobs: list
) -> FinishReason | None:
    """A constrained request whose grammar allows only EOS next takes that EOS now,
    as the step it would cost could only sample it, and ends with STOP."""
    if not eos_token_ids:
        return None
    eos = eos_token_ids[0]
    request.structured.advance(eos)
    request.output_token_ids.append(eos)
    new_token_ids.append(eos)
    if request.sampling.logprobs > 0:
        # The masked distribution's: the one allowed token has probability 1.
        logprobs.append(forced_token_logprob(eos))
    return FinishReason.STOP
