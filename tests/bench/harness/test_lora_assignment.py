"""`cbserve bench --lora-modules ... --lora-assignment ...`: requests spread over adapters
as vLLM's bench spreads them, the flags a local stack gets, and the adapter names on the
wire (the `model` of an OpenAI request) and in the results."""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import pytest

from bench.harness.lora_assignment import LoraModules, assign, describe, on_base
from bench.harness.results import Column, comparisons
from bench.harness.workload import BenchRequest
from bench.serving import options, serve
from tests.bench.peers.test_openai_backend import MODEL, OpenAIServer

REQUESTS = [BenchRequest(i, [5, 6, 7 + i], 4, seed=i) for i in range(12)]


def parse(*argv):
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    return args, options.check(args)


def test_round_robin_cycles_the_adapters_in_order():
    assigned = assign(REQUESTS, ("a", "b", "c"), "round-robin", seed=0)
    assert [r.lora_name for r in assigned] == ["a", "b", "c"] * 4
    # Nothing else of a request moves.
    assert [r.prompt_token_ids for r in assigned] == [r.prompt_token_ids for r in REQUESTS]


def test_random_is_seeded_and_uses_every_adapter():
    first = [r.lora_name for r in assign(REQUESTS, ("a", "b"), "random", seed=3)]
    assert first == [r.lora_name for r in assign(REQUESTS, ("a", "b"), "random", seed=3)]
    assert set(first) == {"a", "b"}
    others = [[r.lora_name for r in assign(REQUESTS, ("a", "b"), "random", seed=s)] for s in (4, 5)]
    assert any(other != first for other in others)


def test_no_adapters_leaves_every_request_on_the_base():
    assert all(r.lora_name == "" for r in assign(REQUESTS, (), "random", seed=0))
    assert describe(REQUESTS, "random") == {}


def test_the_description_counts_requests_per_adapter():
    assigned = assign(REQUESTS, ("x", "y"), "round-robin", seed=0)
    assert describe(assigned, "round-robin") == {
        "lora_assignment": "round-robin",
        "lora_requests": {"x": 6, "y": 6},
    }


def test_modules_take_names_or_name_equals_path():
    modules = LoraModules.parse(["a=/adapters/a", "b"])
    assert modules.names == ("a", "b") and modules.paths == {"a": "/adapters/a"}
    for bad in (["=x"], ["a="], ["a", "a=/p"]):
        with pytest.raises(ValueError, match="--lora-modules"):
            LoraModules.parse(bad)


def test_a_local_stack_loads_the_adapters_given_with_paths():
    args, problem = parse("--lora-modules", "a=/ad/a", "b=/ad/b", "--worker-args", "--max-loras 1")
    assert problem is None
    worker, scheduler = options.stack_args(args, None)
    limits = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2"]
    # The user's --worker-args come last, so that they win.
    assert worker[worker.index("--enable-lora") :] == [*limits, "--max-loras", "1"]
    assert scheduler == [*limits, "--lora-modules", "a=/ad/a", "b=/ad/b"]
    # Names alone: the server serves them already; the stack is left as it is.
    args, _ = parse("--lora-modules", "a", "b")
    assert "--enable-lora" not in options.stack_args(args, None)[1]


def test_flags_are_checked():
    assert parse("--lora-assignment", "round-robin")[1] is None
    assert "--lora-modules" in parse("--lora-modules", "a=")[1]
    assert "baselines" in parse("--lora-modules", "a", "--baselines", "hf")[1]
    with pytest.raises(SystemExit):
        parse("--lora-assignment", "sequential")
    assert parse("--lora-modules", "a", "--lora-beside-base")[1] is None
    assert "--lora-modules" in parse("--lora-beside-base")[1]


def test_beside_the_base_the_same_requests_name_no_adapter_and_get_a_ratio():
    assigned = assign(REQUESTS, ("a", "b"), "random", seed=0)
    base = on_base(assigned)
    assert all(r.lora_name == "" for r in base)
    assert [r.prompt_token_ids for r in base] == [r.prompt_token_ids for r in assigned]
    columns = [Column("cbserve", "cbserve", math.inf), Column("base", "base", math.inf)]
    assert comparisons(columns) == [("cbserve vs the base", "cbserve", "base")]


def test_the_openai_backend_names_each_adapter_as_the_model(tmp_path, model_dir):
    argv = ["--dataset", "random", "--num-prompts", "6", "--random-output-len", "3"]
    argv += ["--no-plots", "--no-progress", "--out-dir", str(tmp_path)]
    argv += ["--lora-modules", "sql", "chat", "--lora-assignment", "round-robin"]
    with OpenAIServer() as server:
        argv = ["--backend", "openai", "--base-url", server.url, "--api-key", "test-key", *argv]
        assert serve.main(argv) == 0
    # The warm-up goes to the base (the first model listed); the workload, to the adapters.
    models = Counter(body["model"] for body in server.bodies)
    assert models == {MODEL: 1, "sql": 3, "chat": 3}
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["workload"]["lora_requests"] == {"chat": 3, "sql": 3}
    assert (
        "LoRA adapters (round-robin): chat 3, sql 3 requests"
        in (tmp_path / "results.md").read_text()
    )
