"""What the model and the KV pool can hold, and a request's max_tokens fitted to it.

A request must fit one worker whole (its prompt and every token it may generate), so
the limits are the model's maximum length and the KV capacity of the largest worker.
The prompt is checked against them as it is tokenized (api/prompt.py); what is left
over is the room max_tokens is fitted to here, once the prompt's length is known.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.errors import InvalidArgument
from common.sampling_params import SamplingParams


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int
    # KV capacity of the largest worker: a request must fit one worker whole.
    kv_capacity_tokens: int

    def __post_init__(self) -> None:
        if min(self.max_model_len, self.vocab_size, self.kv_capacity_tokens) < 1:
            raise ValueError(f"model limits must be positive: {self}")


def fit_max_tokens(
    sampling: SamplingParams, prompt_len: int, limits: ModelLimits
) -> SamplingParams:
    """The sampling settings with max_tokens fitted to the room the prompt leaves.

    A default max_tokens is shortened to what fits; one the client asked for is
    refused when it does not fit, naming which limit (the model's length or a
    worker's KV cache) it exceeds and the allowed range.
    """
    room = min(limits.max_model_len, limits.kv_capacity_tokens) - prompt_len
    if room < 1:
        limit = min(limits.max_model_len, limits.kv_capacity_tokens)
        raise InvalidArgument(
            "prompt",
            f"{prompt_len} tokens leave no room to generate: at most {limit - 1} prompt tokens "
            f"(the model's maximum length is {limits.max_model_len}, a worker's KV cache holds "
            f"{limits.kv_capacity_tokens} tokens)",
        )
    if sampling.max_tokens <= room:
        return sampling
    if not sampling.max_tokens_explicit:
        # The default is a convenience, not a demand: shorten it to what fits.
        return dataclasses.replace(
            sampling, max_tokens=room, min_tokens=min(sampling.min_tokens, room)
        )
    if prompt_len + sampling.max_tokens > limits.max_model_len:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"prompt ({prompt_len} tokens) plus max_tokens ({sampling.max_tokens}) exceeds "
            f"the model's maximum length {limits.max_model_len}; allowed: [1, {room}]",
        )
    raise InvalidArgument(
        "sampling.max_tokens",
        f"prompt ({prompt_len} tokens) plus max_tokens ({sampling.max_tokens}) needs "
        f"{prompt_len + sampling.max_tokens} tokens of KV cache, but a worker holds "
        f"{limits.kv_capacity_tokens}; allowed: [1, {room}]",
    )
