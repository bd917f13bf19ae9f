"""What one `cbserve bench replicas` run measures: its flags, validated once.

Each `flag(...)` field is a flag of `cbserve bench replicas` (python -m
bench.replicas.run), with the variable CBSERVE_BENCH_REPLICAS_<FLAG>.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from common.flag_fields import flag

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")


@dataclass(frozen=True)
class ReplicasBenchConfig:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_BENCH_REPLICAS_"

    replicas: int = flag(3, help="cbserve replicas behind the router, each a scheduler + worker")
    conversations: int = flag(32, help="multi-turn conversations in each phase")
    turns: int = flag(4, help="turns per conversation; each repeats the conversation so far")
    concurrency: int = flag(8, help="conversations in flight at once (each one turn at a time)")
    system_words: int = flag(
        160, help="words of each conversation's own system prompt (the prefix its turns share)"
    )
    user_words: int = flag(24, help="words of each user turn")
    max_tokens: int = flag(24, help="tokens each reply generates (EOS ignored)")
    policies: list[str] = flag(
        default_factory=lambda: ["cache_aware", "round_robin"],
        choices=POLICIES,
        metavar="LIST",
        help="router policies to measure, each against one replica serving everything",
    )
    kill: bool = flag(
        True,
        help="also run a phase with cache_aware in which one replica is SIGKILLed once a third "
        "of the requests are answered (--no-kill: skip it)",
    )
    null_step_ms: float = flag(2.0, help="the null workers' time per step (--null-step-ms)")
    num_kv_blocks: int = flag(
        8192,
        help="each replica's KV pool in blocks: room for every conversation on one replica, so "
        "that the comparison is routing alone, not evictions",
    )
    request_timeout_s: float = flag(
        90.0, help="a request not answered in this long counts as hung (the client gives up)"
    )
    seed: int = flag(0, help="seed of the conversations' words (each phase adds its index)")
    out_dir: Path = flag(Path("out/bench-replicas"), help="results.md and results.json go here")

    def __post_init__(self) -> None:
        for name in ("replicas", "conversations", "turns", "concurrency", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kill and self.replicas < 2:
            raise ValueError("killing a replica mid-run needs --replicas 2 or more")
        if not self.policies or set(self.policies) - set(POLICIES):
            raise ValueError(f"policies must be some of {POLICIES}, got {self.policies}")
        if self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be > 0")
