"""The phases of `cbserve bench replicas`, each over its own conversations (its own
seed: no phase finds another's prefixes cached) on the same running replicas.

- `one replica`: every conversation straight to replica 0, the reference.
- one per router policy: the router over every replica.
- `cache_aware, one killed`: a replica SIGKILLed once a third of the turns are answered;
  every turn must still be answered, none may hang.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass, field

from bench.replicas.config import ReplicasBenchConfig
from bench.replicas.conversations import TurnResult, run_conversations
from bench.replicas.fleet import Router, kill_replica
from cbserve.local_stack import LocalStack

HITS = "cbserve_prefix_cache_hits_total"
QUERIES = "cbserve_prefix_cache_queries_total"


@dataclass
class Phase:
    name: str
    results: list[TurnResult]
    wall_s: float
    # Summed over the replicas that lived to the end: the schedulers' own counters.
    metric_hits: int = 0
    metric_queries: int = 0
    per_replica_hits: list[int] = field(default_factory=list)
    router_retries: int = 0
    killed_at_turn: int | None = None

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def answered(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def hung(self) -> int:
        return sum("hung" in r.error for r in self.results)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.results)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.results)

    @property
    def slowest_s(self) -> float:
        return max((r.latency_s for r in self.results), default=0.0)


def _counter(stack: LocalStack, name: str) -> int:
    return int(sum(v for k, v in stack.metrics().items() if k.split("{")[0] == name))


def model_name(stack: LocalStack) -> str:
    with urllib.request.urlopen(stack.http_url + "/v1/models", timeout=10.0) as response:
        return json.load(response)["data"][0]["id"]


def _drive(config: ReplicasBenchConfig, url: str, model: str, seed: int, on_turn=None):
    started = time.monotonic()
    results = asyncio.run(
        run_conversations(
            url, model, conversations=config.conversations, turns=config.turns,
            concurrency=config.concurrency, system_words=config.system_words,
            user_words=config.user_words, max_tokens=config.max_tokens,
            timeout_s=config.request_timeout_s, seed=seed,
            on_turn=on_turn or (lambda result: None),
        )
    )  # fmt: skip
    return results, time.monotonic() - started


def _retries(router: Router) -> int:
    # The gateway counts each retry it makes (smg_http_retries_total, by route).
    total = 0
    for line in router.metrics_text().splitlines():
        if line.startswith("smg_") and "retries_total" in line.split("{")[0]:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def measured(name, config, stacks, url, model, seed, router=None, on_turn=None) -> Phase:
    """One phase: the conversations against url, the replicas' counters around it."""
    before = [(_counter(s, HITS), _counter(s, QUERIES)) for s in stacks]
    results, wall = _drive(config, url, model, seed, on_turn)
    after = [(_counter(s, HITS), _counter(s, QUERIES)) for s in stacks]
    hits = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    return Phase(
        name, results, wall, sum(hits),
        sum(a[1] - b[1] for a, b in zip(after, before, strict=True)), hits,
        _retries(router) if router else 0,
    )  # fmt: skip


def one_replica(config, stacks, model) -> Phase:
    return measured("one replica", config, stacks[:1], stacks[0].http_url, model, config.seed)


def behind_router(config, stacks, model, policy: str, seed: int, log_path) -> Phase:
    with Router([s.http_url for s in stacks], policy, log_path=log_path) as router:
        return measured(policy, config, stacks, router.url, model, seed, router)


def with_a_replica_killed(config, stacks, model, seed: int, log_path) -> Phase:
    """cache_aware over every replica; the last one is killed once a third of the turns
    are answered. The survivors' counters are the phase's."""
    victim = stacks[-1]
    total = config.conversations * config.turns
    answered = []
    killed_at: list[int] = []

    def on_turn(result: TurnResult) -> None:
        answered.append(result)
        if not killed_at and len(answered) >= total // 3:
            killed_at.append(len(answered))
            kill_replica(victim)  # runs on the event loop's thread: requests stay in flight

    survivors = stacks[:-1]
    with Router([s.http_url for s in stacks], "cache_aware", log_path=log_path) as router:
        before = [_counter(s, HITS) for s in survivors]
        results, wall = _drive(config, router.url, model, seed, on_turn)
        hits = [_counter(s, HITS) - b for s, b in zip(survivors, before, strict=True)]
        retries = _retries(router)
    return Phase("cache_aware, one killed", results, wall, sum(hits), 0, hits, retries,
                 killed_at[0] if killed_at else None)  # fmt: skip
