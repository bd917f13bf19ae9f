"""LoRA adapters scheduled over real processes (issue 43): more adapters than
--max-loras in one run, each request's reply its reply alone; a worker killed
mid-run recomputes an adapter's request on the other worker (which loads the adapter
first), token for token.

Two one-thread float32 workers (the fault tests' workers, tests/integration/liveness.py)
with two adapter slots each, behind a scheduler with --max-loras 1 and three adapters
made here on the default model with random A and B (bench/lora_adapters.py: PEFT's own
init leaves B zero, which would hide a missing delta). With one adapter a step, the
adapters' requests take turns and the base's run beside any of them; with three
adapters on two slots a worker must evict one to load another.

"Token for token" up to a near tie (tests/near_ties.py): the batched and recomputed
rows are other shapes than a request alone, so a greedy choice between two tokens
within 0.05 nats may go either way; both runs carry logprobs to tell a tie from a bug.
"""

from __future__ import annotations

import pytest

from bench.lora_adapters import ALL_TARGETS, ATTENTION_TARGETS, load_base, make_adapter
from tests.integration.liveness import (
    WORKER_ARGS,
    WORKER_TIMEOUT_S,
    requests_recomputed,
    run_greedy,
    wait_until,
    workers_connected,
)
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle
from tests.near_ties import assert_same_reply_up_to_a_near_tie

MAX_TOKENS = 24
LOGPROBS = 5
LIMITS = ["--enable-lora", "--max-loras", "1", "--max-cpu-loras", "2", "--max-lora-rank", "8"]
SHAPES = {"sql": (8, ALL_TARGETS), "chat": (4, ATTENTION_TARGETS), "poem": (8, ATTENTION_TARGETS)}
PROMPTS = [
    ("Write a short sentence about the sea.", ""),
    ("Write a short sentence about the sea.", "sql"),
    ("Write a short sentence about the sea.", "chat"),
    ("List three fruits.", "poem"),
    ("List three fruits.", "sql"),
    ("List three fruits.", ""),
    ("Name a large city.", "chat"),
    ("Name a large city.", "poem"),
]


def _requests() -> list[dict]:
    return [{"prompt": prompt, "lora_name": name} for prompt, name in PROMPTS]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    base = load_base()
    return {
        name: str(make_adapter(root / name, rank=rank, targets=targets, seed=i, base_model=base))
        for i, (name, (rank, targets)) in enumerate(SHAPES.items(), start=1)
    }


@pytest.fixture(scope="module")
def stack(adapters):
    modules = [f"{name}={path}" for name, path in adapters.items()]
    running = started_stack(
        num_workers=2,
        worker_args=[*WORKER_ARGS, *LIMITS],
        scheduler_args=[
            "--worker-timeout",
            str(WORKER_TIMEOUT_S),
            *LIMITS,
            "--lora-modules",
            *modules,
        ],
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def alone(stack) -> list:
    """Each request by itself, one after another (before any fault)."""
    wait_until("2 workers connected", lambda: workers_connected(stack) == 2)
    replies = []
    for request in _requests():
        (outcome,), _ = run_greedy(stack.address, [request], MAX_TOKENS, logprobs=LOGPROBS)
        assert outcome.finish_reason, request
        replies.append(outcome)
    # The adapters move the replies (a delta not applied would fail here): sql, rank 8
    # on every projection, on both prompts the base answers too.
    by_prompt = {(p, n): o.tokens for (p, n), o in zip(PROMPTS, replies, strict=True)}
    for prompt in ("Write a short sentence about the sea.", "List three fruits."):
        assert by_prompt[(prompt, "sql")] != by_prompt[(prompt, "")], prompt
    return replies


# This module runs in make test-slow (43 s with its two-worker stack); make test serves
# adapters through a stack in test_http_adapters.py. The kill test below runs the same
# mix of adapters, more than --max-loras, with a worker killed.
@pytest.mark.slow
def test_more_adapters_than_max_loras_in_one_run_each_reply_as_alone(stack, alone):
    outcomes, _ = run_greedy(stack.address, _requests(), MAX_TOKENS, logprobs=LOGPROBS)
    for (prompt, name), got, expected in zip(PROMPTS, outcomes, alone, strict=True):
        assert got.finish_reason, (prompt, name, got.code)
        assert_same_reply_up_to_a_near_tie(got, expected, f"{name or 'base'}: {prompt!r}")
    wait_until_idle(stack)


@pytest.mark.slow
def test_a_worker_killed_mid_run_recomputes_adapter_requests_elsewhere(stack, alone):
    recomputed_before = requests_recomputed(stack)
    outcomes, _ = run_greedy(
        stack.address,
        _requests(),
        MAX_TOKENS,
        lambda: _busiest_worker(stack).process.kill(),
        after_tokens=2,
        logprobs=LOGPROBS,
    )
    assert requests_recomputed(stack) > recomputed_before, "the kill moved no request"
    for (prompt, name), got, expected in zip(PROMPTS, outcomes, alone, strict=True):
        assert got.finish_reason, (prompt, name, got.code)
        assert_same_reply_up_to_a_near_tie(got, expected, f"{name or 'base'}: {prompt!r}")
    wait_until_idle(stack)


def _busiest_worker(stack):
    """The worker running the most requests now: placement may have put them all on
    one, and killing an idle worker would recompute nothing."""
    samples = stack.metrics()

    def running(index: int) -> float:
        address = f"{stack.host}:{stack.worker_ports[index]}"
        return sum(
            value
            for name, value in samples.items()
            if name.startswith("cbserve_worker_num_requests_running") and address in name
        )

    return stack.workers[max(range(len(stack.workers)), key=running)]
