"""When a request's tokens alone end it: the core's stop rules.

In vLLM's order of precedence: EOS (unless ignore_eos) or a stop token id ends
with STOP; then max_tokens or the model's maximum length ends with LENGTH. A stop
on EOS, a stop token id or a stop string needs min_tokens output tokens before the
token that stops: the worker masks those ids for the first min_tokens tokens
(SamplingParams.min_tokens_banned_ids), and a stop string completed by one of them
is ordinary text. Length limits always apply.

These rules are the core's because they cost per step, not per character, and
need no tokenizer: the core ends a request on them without waiting for its text.
Stop strings can only be seen in text, so they are the edge's
(output/stop_strings.py); `stops_active` is the one rule both sides share.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.sampling_params import SamplingParams
from scheduler_svc.core.request import FinishReason


def stops_active(num_output_tokens: int, min_tokens: int) -> bool:
    """Whether the num_output_tokens-th output token may stop the request (EOS, a stop
    token id in the core, a stop string at the edge): only past min_tokens."""
    return num_output_tokens > min_tokens


class StopChecker:
    """Decides from a request's token ids whether it has finished."""

    def __init__(
        self, sampling: SamplingParams, eos_token_ids: Sequence[int], max_model_len: int
    ) -> None:
        eos = () if sampling.ignore_eos else tuple(eos_token_ids)
        self._stop_ids = frozenset(eos) | frozenset(sampling.stop_token_ids)
        self._min_tokens = sampling.min_tokens
        self._max_tokens = sampling.max_tokens
        self._max_model_len = max_model_len

    def stops_active(self, num_output_tokens: int) -> bool:
        return stops_active(num_output_tokens, self._min_tokens)

    def check(
        self, token_id: int, num_output_tokens: int, num_prompt_tokens: int
    ) -> FinishReason | None:
        """The finish reason the num_output_tokens-th output token, token_id, brings."""
        if stops_active(num_output_tokens, self._min_tokens) and token_id in self._stop_ids:
            return FinishReason.STOP
        if (
            num_output_tokens >= self._max_tokens
            or num_prompt_tokens + num_output_tokens >= self._max_model_len
        ):
            return FinishReason.LENGTH
        return None
