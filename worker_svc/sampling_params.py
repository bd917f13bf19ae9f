"""Per-sequence sampling settings, as the scheduler resolved them, checked once on arrival."""

from __future__ import annotations

from dataclasses import dataclass

from cbserve.worker.v1 import worker_pb2

# Below this temperature a row is greedy (vLLM uses the same cut-off).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    # 0 or -1: no top-k.
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    num_logprobs: int = 0
    min_tokens: int = 0
    min_tokens_banned_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (both: disabled) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != getattr(self, name):
                raise ValueError(f"{name} must be a number")
        if self.num_logprobs < 0 or self.min_tokens < 0:
            raise ValueError("num_logprobs and min_tokens must be >= 0")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed}")

    @property
    def greedy(self) -> bool:
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
        return self.top_k > 0

    @classmethod
    def from_proto(cls, message: worker_pb2.SequenceSampling) -> SamplingParams:
        return cls(
            temperature=message.temperature,
            top_p=message.top_p,
            top_k=message.top_k,
            min_p=message.min_p,
            seed=message.seed if message.HasField("seed") else None,
            presence_penalty=message.presence_penalty,
            frequency_penalty=message.frequency_penalty,
            repetition_penalty=message.repetition_penalty,
            num_logprobs=message.num_logprobs,
            min_tokens=message.min_tokens,
            min_tokens_banned_ids=tuple(message.min_tokens_banned_ids),
        )
