"""The counters of speculative decoding, as vLLM's spec_decode_* metrics count them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftStats:
    """Counters as vLLM's spec_decode_* metrics count them."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [i]: drafts whose i-th token (from 0) was accepted.
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        positions = self.accepted_per_position
        if len(positions) < num_drafts:
            positions.extend([0] * (num_drafts - len(positions)))
        for i in range(num_accepted):
            positions[i] += 1

    def merge(self, other: DraftStats) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i, count in enumerate(other.accepted_per_position):
            if i == len(self.accepted_per_position):
                self.accepted_per_position.append(0)
            self.accepted_per_position[i] += count

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafting step emits on average: 1 + accepted per draft (vLLM's)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
