"""Turns one request's sampled tokens into what its client streams.

Per token: decide whether it ends the request (StopChecker), decode it
incrementally (IncrementalDetokenizer), hold back text that may be the start
of a stop string (StopStringMatcher), and package the delta as a
RequestOutput, the final one with the finish reason and usage.

As in vLLM, the ids of the token that stopped the request (EOS, a stop token
id, the token that completed a stop string) are reported, but a stop token's
own text is not, and text after a stop string's start never is.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.core.plan import SampledLogprobs
from scheduler_svc.core.request import FinishReason, Request, RequestOutput, TokenLogprob
from scheduler_svc.output.detokenizer import Decoder, IncrementalDetokenizer
from scheduler_svc.output.stop_checker import StopChecker, StopStringMatcher


class RequestOutputProcessor:
    def __init__(
        self,
        request: Request,
        tokenizer: Decoder,
        eos_token_ids: Sequence[int],
        max_model_len: int,
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_token_ids)
        self._stop_checker = StopChecker(request.sampling, eos_token_ids, max_model_len)
        self._stop_strings = StopStringMatcher(request.sampling.stop)

    def process_token(self, request: Request, logprob: TokenLogprob | None) -> RequestOutput:
        """Post-processes the request's newest output token (already appended).

        The returned output's finish_reason is set when this token ends the request.
        """
        token_id = request.output_token_ids[-1]
        finish_reason = self._stop_checker.check_token(request)
        if finish_reason is FinishReason.STOP:
            # EOS or a stop token id: its own text is not part of the output.
            text = self._stop_strings.flush()
        else:
            stops_active = self._stop_checker.stops_active(request.num_output_tokens)
            new_text = self._detokenizer.add_token(token_id)
            text, stopped = self._stop_strings.add_text(new_text, stops_active)
            if stopped:
                finish_reason = FinishReason.STOP
            elif finish_reason is not None:
                text += self._stop_strings.flush()
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=[token_id],
            new_text=text,
            logprobs=[logprob] if logprob is not None else [],
            finish_reason=finish_reason,
            prompt_tokens=request.num_prompt_tokens,
            completion_tokens=request.num_output_tokens,
            cached_prompt_tokens=request.cached_prompt_tokens,
        )


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
