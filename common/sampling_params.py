"""Sampling settings: one definition, one meaning, for the scheduler and the worker.

The fields' defaults are the service's (vLLM's, except max_tokens: 256): a field
a client leaves unset takes its default here. The scheduler builds it from the
client's request and validates it once, at the door; the worker rebuilds it from
the plan (both through common.sampling_codec, which matches wire fields to these by
name). Every out-of-range value raises InvalidArgument (a ValueError too) naming
the field and its range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.defaults import DEFAULT_MAX_TOKENS
from common.errors import InvalidArgument

# Below this temperature sampling is greedy (argmax).
GREEDY_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64


def _check_range(name: str, value: float, low: float, high: float, low_open=False) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(name, f"must be a finite number, got {value}")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise InvalidArgument(name, f"must be in {bracket}{low:g}, {high:g}], got {value:g}")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = 0
    # Score the prompt: None, no; k, each prompt token's logprob and its k most likely
    # alternatives (vLLM's prompt_logprobs). The plan asks the worker per new sequence
    # (NewSequence.prompt_logprobs), not through the worker's sampling settings.
    prompt_logprobs: int | None = None
    # The ids the worker must not sample while fewer than min_tokens are out: their
    # one home. No client sends them; the scheduler fills them in when it takes the
    # request in (banned_until_min_tokens with the model's EOS; core/request_table.py),
    # and they reach the worker's sampler with the other settings (sampling_codec).
    min_tokens_banned_ids: tuple[int, ...] = ()
    # Whether max_tokens came from the client (an explicit value that does not
    # fit the model is an error; the default is shortened to fit instead).
    max_tokens_explicit: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        _check_range("sampling.temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_range("sampling.top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.top_k < -1:
            raise InvalidArgument(
                "sampling.top_k", f"must be -1, 0 (disabled) or >= 1, got {self.top_k}"
            )
        _check_range("sampling.min_p", self.min_p, 0.0, 1.0)
        if self.max_tokens < 1:
            raise InvalidArgument("sampling.max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidArgument(
                "sampling.min_tokens",
                f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
            )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(
                "sampling.stop", f"at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}"
            )
        for text in self.stop:
            if not 0 < len(text) <= MAX_STOP_STRING_CHARS:
                raise InvalidArgument(
                    "sampling.stop",
                    f"each stop string must have 1 to {MAX_STOP_STRING_CHARS} characters",
                )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidArgument(
                "sampling.stop_token_ids",
                f"at most {MAX_STOP_TOKEN_IDS} ids, got {len(self.stop_token_ids)}",
            )
        _check_range("sampling.presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("sampling.frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range(
            "sampling.repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True
        )
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidArgument("sampling.seed", f"must fit in 64 bits, got {self.seed}")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidArgument(
                "sampling.logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise InvalidArgument(
                "sampling.prompt_logprobs",
                f"must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}",
            )

    @property
    def greedy(self) -> bool:
        """Argmax sampling: the client asked for temperature 0 (below GREEDY_TEMPERATURE
        a softmax would only underflow, vLLM uses the same cut-off)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def uses_top_k(self) -> bool:
        """top_k 0 and -1 both mean no top-k."""
        return self.top_k > 0

    def banned_until_min_tokens(self, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
        """Token ids not to sample while fewer than min_tokens are out: the stop
        tokens, and EOS unless ignored (none without min_tokens)."""
        if not self.min_tokens:
            return ()
        banned = set(self.stop_token_ids)
        if not self.ignore_eos:
            banned.update(eos_token_ids)
        return tuple(sorted(banned))
