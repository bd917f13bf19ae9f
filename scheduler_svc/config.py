"""Scheduler limits: how much work one model step may carry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    # Most sequences admitted (running) at once, hence most sequences in one step.
    max_num_seqs: int = 128
    # Token budget of one step: decodes take one token each, prefills take what is
    # left, split over several steps when a prompt is longer (chunked prefill).
    max_num_batched_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        # Every running sequence must be able to decode in every step; a smaller
        # budget would starve the sequences at the back of the running queue.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}) so that every running sequence can "
                "decode in every step"
            )
