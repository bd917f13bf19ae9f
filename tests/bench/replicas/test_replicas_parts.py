"""bench/replicas' pure parts: its flags, the router's command line, the table."""

from __future__ import annotations

import pytest

from bench.replicas.config import ReplicasBenchConfig
from bench.replicas.conversations import TurnResult, system_prompt
from bench.replicas.fleet import Router
from bench.replicas.phases import Phase
from bench.replicas.run import table


@pytest.mark.parametrize(
    "changes",
    [{"replicas": 0}, {"turns": 0}, {"policies": ["sticky"]}, {"policies": []},
     {"replicas": 1, "kill": True}, {"request_timeout_s": 0.0}],
)  # fmt: skip
def test_bad_flags_are_refused_at_construction(changes):
    with pytest.raises(ValueError):
        ReplicasBenchConfig(**changes)


def test_one_replica_without_a_kill_is_allowed():
    assert ReplicasBenchConfig(replicas=1, kill=False).replicas == 1


def test_each_conversation_starts_with_words_of_its_own():
    first = {system_prompt(0, index, 40)[:60] for index in range(32)}
    assert len(first) == 32
    assert system_prompt(0, 3, 40) == system_prompt(0, 3, 40)
    assert system_prompt(0, 3, 40) != system_prompt(1, 3, 40)


def test_the_router_command_is_accepted_by_sglang_routers_own_parser():
    launch_router = pytest.importorskip("sglang_router.launch_router")
    router = Router(["http://127.0.0.1:1", "http://127.0.0.1:2"], "round_robin")
    argv = router.argv()
    module = argv.index("-m") + 1
    assert argv[module] == "sglang_router.launch_router"
    parsed = launch_router.parse_router_args(argv[module + 1 :])
    assert parsed.policy == "round_robin"
    assert parsed.worker_urls == router.worker_urls
    assert parsed.retry_max_retries == router.retry_max_retries >= 2
    assert parsed.port == router.port


def _phase(name: str, cached: list[int], ok: bool = True) -> Phase:
    error = "" if ok else "no answer within 9s (hung)"
    results = [TurnResult(0, turn, ok, 200 if ok else 0, error, 0.1, 100, hits)
               for turn, hits in enumerate(cached)]  # fmt: skip
    return Phase(name, results, 1.0, sum(cached), 400, [sum(cached)])


def test_the_table_compares_each_phase_with_one_replica():
    text = table([_phase("one replica", [0, 50, 50]), _phase("round_robin", [0, 25, 25]),
                  _phase("cache_aware, one killed", [0, 0], ok=False)])  # fmt: skip
    rows = text.splitlines()[2:]
    assert "| 1.000x |" in rows[0]
    assert "| 0.500x |" in rows[1]
    assert "| 0/2 | 2 |" in rows[2]  # none answered, both hung
