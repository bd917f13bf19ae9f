"""Counters one worker's scheduler adds to; they outlive a scheduler reset.

An engine keeps one SchedulerStats for its whole life and hands it to every
Scheduler it builds (a new one after each reconnect), so that the counters
exported as Prometheus metrics only ever grow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_svc.core.speculation_stats import DraftStats


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    # In tokens, as vLLM counts them: tokens looked up at admission, and how
    # many of those were found in the prefix cache.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Speculative decoding (core/speculation.py).
    drafts: DraftStats = field(default_factory=DraftStats)

    def add(self, other: SchedulerStats) -> None:
        """Adds another scheduler's counters (a removed worker's, kept by the pool)."""
        self.num_preemptions += other.num_preemptions
        self.prefix_cache_queries += other.prefix_cache_queries
        self.prefix_cache_hits += other.prefix_cache_hits
        self.drafts.merge(other.drafts)
