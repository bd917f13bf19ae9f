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


class AcceptanceLog:
    """Logs the acceptance every `interval_s` while drafts are verified, as vLLM's
    SpecDecoding metrics line does: drafts, draft and accepted tokens, the mean
    acceptance length and the rate per position, over the interval."""

    def __init__(self, stats: DraftStats, log, cost_ratio, interval_s: float = 10.0):
        self._stats = stats
        self._cost_ratio = cost_ratio  # () -> the fitted cost of a row (StepCost.ratio)
        self._log = log
        self._interval_s = interval_s
        self._last = DraftStats()
        self._last_at: float | None = None

    def maybe_log(self, now: float) -> None:
        if self._last_at is None:
            self._last_at = now
            return
        if now - self._last_at < self._interval_s:
            return
        stats, last = self._stats, self._last
        drafts = stats.num_drafts - last.num_drafts
        if drafts:
            accepted = stats.num_accepted_tokens - last.num_accepted_tokens
            draft_tokens = stats.num_draft_tokens - last.num_draft_tokens
            per_position = [
                round(
                    (
                        now_count
                        - (
                            last.accepted_per_position[i]
                            if i < len(last.accepted_per_position)
                            else 0
                        )
                    )
                    / drafts,
                    3,
                )
                for i, now_count in enumerate(stats.accepted_per_position)
            ]
            self._log.info(
                "spec_decode",
                drafts=drafts,
                draft_tokens=draft_tokens,
                accepted_tokens=accepted,
                mean_acceptance_length=round(1 + accepted / drafts, 3),
                draft_acceptance_rate=round(accepted / draft_tokens, 3),
                acceptance_per_position=per_position,
                row_cost_ratio=round(self._cost_ratio(), 4),
            )
        self._last = DraftStats()
        self._last.merge(stats)
        self._last_at = now
