"""Scheduler limits: how much work one model step may carry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    # Most sequences admitted (running) at once, hence most sequences in one step
    # (see max_running_seqs).
    max_num_seqs: int = 128
    # Token budget of one step: decodes take one token each, prefills take what is
    # left, split over several steps when a prompt is longer (chunked prefill).
    max_num_batched_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def max_running_seqs(self) -> int:
        """The cap on running sequences that the scheduler applies.

        A step must be able to give every running sequence its decode token, or
        the sequences at the back of the running queue would starve; so a budget
        smaller than max_num_seqs (handy to force chunking in tests) also caps
        the sequences. vLLM refuses such a config instead.
        """
        return min(self.max_num_seqs, self.max_num_batched_tokens)
