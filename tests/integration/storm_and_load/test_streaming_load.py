"""The load: two identical rounds of 500 concurrent streaming clients (4 tokens each,
over 4 channels of one TCP connection each), each round bounded in time; all
complete, and the scheduler's RSS (VmRSS of its process) after the second round is
within 10% of the first.

The counts (clients, completed, seconds, RSS) are printed: run with `pytest -s` to
see them. A bigger variant (five rounds) is marked `slow`: `make test-slow` runs it,
`make test` does not.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from tests.integration.stacks import wait_until_idle
from tests.integration.storm_and_load.harness import (
    NUM_REQUESTS,
    Plan,
    bad_log_lines,
    run_round,
    short_prompts,
)

LOAD_TOKENS = 4
RSS_TOLERANCE = 0.10


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _load(storm_stack, tokenizer, rounds: int, seed: int) -> None:
    stack = storm_stack.stack
    pid = stack.scheduler.process.pid
    pairs = [(prompt, LOAD_TOKENS) for prompt, _ in short_prompts(tokenizer, NUM_REQUESTS, seed)]
    plans = [Plan() for _ in pairs]
    log_start = storm_stack.log_size()
    rss: list[int] = []
    durations: list[float] = []
    first_tokens = None
    for number in range(1, rounds + 1):
        started = time.monotonic()
        outcomes = asyncio.run(run_round(stack.address, pairs, plans))
        durations.append(time.monotonic() - started)
        wait_until_idle(stack)
        rss.append(_rss_bytes(pid))
        statuses = Counter(outcome.status for outcome in outcomes)
        slowest = max(outcome.seconds for outcome in outcomes)
        print(
            f"\nload round {number}: clients={NUM_REQUESTS} completed={statuses['completed']} "
            f"errors={statuses['error']} seconds={durations[-1]:.1f} slowest={slowest:.1f} "
            f"scheduler_rss_mib={rss[-1] / 2**20:.1f}"
        )
        errors = [o for o in outcomes if o.status != "completed"]
        assert not errors, errors[:5]
        tokens = [outcome.token_ids for outcome in outcomes]
        for outcome in outcomes:
            assert len(outcome.token_ids) == pairs[outcome.index][1], outcome
        if first_tokens is None:
            first_tokens = tokens
        else:
            assert tokens == first_tokens, "an identical round gave other tokens"
    growth = rss[-1] / rss[0] - 1
    print(
        f"load: rss_round1_mib={rss[0] / 2**20:.1f} rss_round{rounds}_mib={rss[-1] / 2**20:.1f} "
        f"growth={growth:+.1%} leaked_blocks={stack.metrics()['cbserve_kv_blocks_used']:.0f}"
    )
    assert abs(growth) <= RSS_TOLERANCE, f"scheduler RSS {rss}"
    bad = bad_log_lines(storm_stack.log_text(log_start))
    assert not bad, "\n".join(bad[:20])


# 40 s: `make test-slow` runs it (with the five-round variant); `make test` keeps the
# 250-request cancellation storm on the same stack.
@pytest.mark.slow
def test_500_streaming_clients_complete_and_memory_stays_flat(storm_stack, tokenizer):
    _load(storm_stack, tokenizer, rounds=2, seed=99)


@pytest.mark.slow
def test_many_load_rounds_keep_memory_flat(storm_stack, tokenizer):
    _load(storm_stack, tokenizer, rounds=5, seed=98)
