"""`--speculative-config`: vLLM's JSON for speculative decoding, the n-gram method.

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
                           "prompt_lookup_min": 2, "prompt_lookup_max": 4}'

The keys and their defaults are vLLM's: `num_speculative_tokens` is required; with
neither lookup bound given both are 5, with one given the other takes its value.
`num_speculative_tokens` is the most drafts a sequence verifies in one step; how many
it gets in a step is chosen per step from its acceptance so far and the batch
(core/speculation.py), down to none where drafts would not pay. Methods that need a
draft model (`draft_model`, `eagle`, `mtp`...) and `suffix` are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.config.json_flag import json_object_flag

METHODS = ("ngram",)
# The most drafts a step may verify for one sequence: beyond this a CPU step's cost
# is no longer flat in the rows, and vLLM's n-gram proposer allows no more either.
MAX_SPECULATIVE_TOKENS = 16
_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"--speculative-config: method {self.method!r} is not built; cbserve "
                f"speculates with {', '.join(METHODS)} (prompt lookup, no draft model)"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--speculative-config: {name} must be an integer >= 1")
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"--speculative-config: num_speculative_tokens is at most "
                f"{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "--speculative-config: prompt_lookup_min must not exceed prompt_lookup_max"
            )


def parse_speculative_config(text: str) -> SpeculativeConfig | None:
    """The flag's JSON as a config; None for an empty flag (speculation off)."""
    fields = json_object_flag(text, "--speculative-config", _KEYS)
    if fields is None:
        return None
    if "num_speculative_tokens" not in fields:
        raise ValueError("--speculative-config: num_speculative_tokens is required")
    low, high = fields.pop("prompt_lookup_min", None), fields.pop("prompt_lookup_max", None)
    if low is None and high is None:
        low = high = 5
    return SpeculativeConfig(
        prompt_lookup_min=high if low is None else low,
        prompt_lookup_max=low if high is None else high,
        **fields,
    )
