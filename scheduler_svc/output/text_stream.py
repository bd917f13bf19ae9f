"""The edge's half of output processing: a request's token ids to the text its client
streams, and stop strings.

The core (core/scheduler.py) ends a request on its tokens alone: EOS, a stop token
id, max_tokens, the model length (core/token_stops.py). It sends each step's token ids
without text, because detokenizing costs per token and the core must cost per step
only; the edge, which runs in as many processes as the clients need (vLLM V1's split
between API servers and the engine core), turns them into text here.

A stop string can only be seen in text, so the edge finds it: the text is cut right
before it, the tokens after the one that completed it are dropped, the output is
the request's last (finish reason STOP) and the caller tells the core to drop the
request. The core may have computed a step or two more by then; those tokens are
never streamed, as vLLM's front end drops what its engine computed past a stop.

As in vLLM, the ids of the token that stopped the request (EOS, a stop token id,
the token that completed a stop string) are reported, but a stop token's own text
is not, and text after a stop string's start never is.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.sampling_params import SamplingParams
from scheduler_svc.core.request import FinishReason, RequestOutput
from scheduler_svc.core.token_stops import stops_active
from scheduler_svc.output.detokenizer import Decoder, IncrementalDetokenizer
from scheduler_svc.output.stop_strings import StopStringMatcher


class TextStream:
    def __init__(
        self, tokenizer: Decoder, prompt_token_ids: Sequence[int], sampling: SamplingParams
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids)
        self._stop_strings = StopStringMatcher(sampling.stop)
        self._min_tokens = sampling.min_tokens

    def process(self, output: RequestOutput) -> tuple[RequestOutput, bool]:
        """The output with its text; and whether a stop string ended the request here
        (the output is then cut after the token that completed it and is the last one).

        `output` carries one or more consecutive tokens (a multi-step plan, or steps
        coalesced for a slow reader) and the core's finish reason for its last one.
        """
        token_ids = output.new_token_ids
        last = len(token_ids) - 1
        # The 1-based position among the request's output tokens of token_ids[0].
        first_position = output.completion_tokens - last
        pieces: list[str] = []
        for index, token_id in enumerate(token_ids):
            if index == last and output.finish_reason is FinishReason.STOP:
                # EOS or a stop token id: its own text is not part of the output.
                pieces.append(self._stop_strings.flush())
                break
            new_text = self._detokenizer.add_token(token_id)
            active = stops_active(first_position + index, self._min_tokens)
            released, stopped = self._stop_strings.add_text(new_text, active)
            pieces.append(released)
            if stopped:
                return _cut(output, index, "".join(pieces)), True
        else:
            if output.finish_reason is not None:
                pieces.append(self._stop_strings.flush())
        # In place: the output is this stream's own from the core on (no copy per step).
        output.new_text = pieces[0] if len(pieces) == 1 else "".join(pieces)
        return output, False


def _cut(output: RequestOutput, index: int, text: str) -> RequestOutput:
    """The output up to and including its token at index, ended by a stop string."""
    dropped = len(output.new_token_ids) - 1 - index
    del output.new_token_ids[index + 1 :]
    del output.logprobs[index + 1 :]
    output.new_text = text
    output.finish_reason = FinishReason.STOP
    output.completion_tokens -= dropped
    return output
