"""Three cbserve replicas behind SGLang's model gateway (sglang-router from PyPI), all
real processes on loopback: each replica a scheduler with its own null worker (the
scheduler's block tables and prefix cache are the real ones; no model is loaded).

- cache_aware keeps the cached prompt tokens one replica serving everything keeps
  (issue 33's target: at least 0.9x), and round_robin, which sends each turn of a
  conversation to another replica, keeps far fewer;
- a replica SIGKILLed mid-run: every turn is still answered (the router retries it on
  another replica), none hangs.

`cbserve bench replicas` is the same at the issue's size, with a table.
"""

from __future__ import annotations

import pytest

from bench.replicas.config import ReplicasBenchConfig
from bench.replicas.fleet import router_missing, start_replicas
from bench.replicas.phases import behind_router, model_name, one_replica, with_a_replica_killed

pytestmark = pytest.mark.skipif(
    router_missing() is not None,
    reason=f"{router_missing()}: the dev extra installs it (make env, .ci/run)",
)

REPLICAS = 3
# Small: a few seconds of traffic per phase on two shared cores.
CONFIG = ReplicasBenchConfig(
    replicas=REPLICAS, conversations=6, turns=3, concurrency=3, system_words=96,
    user_words=16, max_tokens=16, request_timeout_s=60.0, num_kv_blocks=2048,
)  # fmt: skip


@pytest.fixture(scope="module")
def replicas():
    stacks = start_replicas(REPLICAS, CONFIG.null_step_ms, CONFIG.num_kv_blocks)
    yield stacks
    for stack in stacks:
        stack.stop()


def test_cache_aware_keeps_the_cache_hits_of_one_replica(replicas, tmp_path):
    model = model_name(replicas[0])
    alone = one_replica(CONFIG, replicas, model)
    routed = behind_router(CONFIG, replicas, model, "cache_aware", 1, tmp_path / "router.log")
    turns = CONFIG.conversations * CONFIG.turns
    assert (alone.answered, routed.answered) == (turns, turns)
    # Every turn after the first repeats its conversation: one replica finds it cached.
    assert alone.cached_tokens > alone.prompt_tokens / 3
    assert routed.cached_tokens >= 0.9 * alone.cached_tokens
    # The usage the clients saw is what the replicas' own counters say.
    assert routed.cached_tokens == routed.metric_hits
    assert alone.cached_tokens == alone.metric_hits


def test_round_robin_scatters_conversations(replicas, tmp_path):
    model = model_name(replicas[0])
    # One conversation at a time: turn k of each goes to replica (k + offset) mod 3, never
    # to the one holding its earlier turns, so almost nothing is found cached.
    config = ReplicasBenchConfig(**{**CONFIG.__dict__, "concurrency": 1})
    scattered = behind_router(config, replicas, model, "round_robin", 2, tmp_path / "rr.log")
    kept = behind_router(config, replicas, model, "cache_aware", 3, tmp_path / "ca.log")
    assert scattered.answered == kept.answered == config.conversations * config.turns
    assert scattered.cached_tokens < 0.5 * kept.cached_tokens


def test_a_replica_killed_mid_run_loses_no_request(replicas, tmp_path):
    # Last in this module: it kills the last replica for good.
    model = model_name(replicas[0])
    phase = with_a_replica_killed(CONFIG, replicas, model, 4, tmp_path / "kill.log")
    assert phase.killed_at_turn is not None
    assert replicas[-1].scheduler.process.poll() is not None
    failed = [r for r in phase.results if not r.ok]
    assert not failed, failed
    assert phase.hung == 0
    assert phase.answered == CONFIG.conversations * CONFIG.turns
    assert phase.slowest_s < CONFIG.request_timeout_s
