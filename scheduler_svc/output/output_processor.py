"""Merging a request's outputs at the edge: consecutive outputs of one request become
one delta (a multi-step plan, or a client that reads slower than the steps come).

The core makes one output per step with its token ids, the logprobs it asked for
and the finish reason its tokens bring (core/token_intake.py); the text is the
edge's work (text_stream.TextStream)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.core.request import RequestOutput


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
