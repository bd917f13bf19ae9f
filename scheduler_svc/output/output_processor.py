"""A request's outputs as the core makes them: one per step with its token ids, the
logprobs it asked for and the finish reason its tokens bring (StopChecker); the
text is the edge's work (text_stream.TextStream). Consecutive outputs of one
request merge into one delta (a multi-step plan, or a client that reads slower
than the steps come)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.core.plan import SampledLogprobs
from scheduler_svc.core.request import Request, RequestOutput, TokenLogprob


def merge_outputs(outputs: Sequence[RequestOutput]) -> RequestOutput:
    """One request's outputs of consecutive tokens as one delta (the client gets fewer,
    larger messages; the last one carries the finish reason and the usage)."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    return RequestOutput(
        request_id=last.request_id,
        new_token_ids=[token_id for output in outputs for token_id in output.new_token_ids],
        new_text="".join(output.new_text for output in outputs),
        logprobs=[entry for output in outputs for entry in output.logprobs],
        finish_reason=last.finish_reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_prompt_tokens=last.cached_prompt_tokens,
        prompt_logprobs=next(
            (output.prompt_logprobs for output in outputs if output.prompt_logprobs), None
        ),
    )


def token_logprob(
    request: Request, token_id: int, entry: SampledLogprobs | None
) -> TokenLogprob | None:
    """The logprob entry a request's output carries for a sampled token, if it asked."""
    if entry is None or request.sampling.logprobs == 0:
        return None
    return TokenLogprob(token_id=token_id, logprob=entry.logprob, top=entry.top)
