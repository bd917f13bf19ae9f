"""The cancellation storm: 250 concurrent greedy requests (ignore_eos, 4 to 8 tokens),
30% of them cancelled with `call.cancel()` at random moments: before they are sent,
once the storm as a whole has streamed a random number of tokens (so the cancel
finds the request waiting, prefilling or decoding, whatever the CPU's speed), or
after their own first (or k-th) token.

Every request not cancelled completes with exactly the tokens of the same prompt
run without the storm (100 distinct prompts, run alone first); a cancelled one has
streamed a prefix of them. Afterwards nothing runs, waits or holds a block, and
the scheduler's stderr has no traceback.

The counts (requests, cancelled, completed, leaked blocks) are printed: run with
`pytest -s` to see them. A bigger variant (2000 requests, 500 at a time) is marked
`slow`: `make test-slow` runs it, `make test` does not.
"""

from __future__ import annotations

import asyncio
import random
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

CANCEL_FRACTION = 0.3
# Requests reuse this many distinct prompts, so the reference run is short.
NUM_DISTINCT = 100
# "storm_tokens" cancels fire before the storm has streamed this share of the tokens
# its requests ask for: counted in tokens, not seconds, so that they land on any CPU
# (timers of up to 15 s let 22% of the requests finish first on a fast one).
STORM_SPREAD = 0.5


def _storm_plans(pairs, fraction: float, seed: int, spread: float) -> list[Plan]:
    rng = random.Random(seed)
    plans = [Plan() for _ in pairs]
    spread_tokens = max(1, int(spread * sum(max_tokens for _, max_tokens in pairs)))
    for index in rng.sample(range(len(pairs)), round(fraction * len(pairs))):
        max_tokens = pairs[index][1]
        kind = rng.choice(("before_send", "storm", "storm", "first_token", "after_tokens"))
        if kind == "before_send":
            plans[index] = Plan("before_send")
        elif kind == "storm":
            # Early ones land while waiting or prefilling; later ones mid-decode.
            plans[index] = Plan("storm_tokens", storm_tokens=rng.randint(1, spread_tokens))
        elif kind == "first_token":
            plans[index] = Plan("after_tokens", after_tokens=1)
        else:
            plans[index] = Plan("after_tokens", after_tokens=rng.randint(2, max_tokens - 1))
    return plans


def _finished(metrics: dict[str, float], reason: str) -> float:
    return metrics.get(f'cbserve_requests_finished_total{{reason="{reason}"}}', 0.0)


def _failed_total(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("cbserve_requests_failed_total"))


def _reference(address: str, distinct) -> list[list[int]]:
    """The distinct prompts alone, none cancelled: the tokens each request must give."""
    outcomes = asyncio.run(run_round(address, distinct, [Plan() for _ in distinct]))
    errors = [o for o in outcomes if o.status != "completed"]
    assert not errors, errors[:5]
    for outcome in outcomes:
        assert len(outcome.token_ids) == distinct[outcome.index][1], outcome
    return [outcome.token_ids for outcome in outcomes]


def _storm(storm_stack, tokenizer, num_requests: int, in_flight: int | None, seed: int):
    stack = storm_stack.stack
    distinct = short_prompts(tokenizer, NUM_DISTINCT, seed)
    rng = random.Random(seed)
    which = [rng.randrange(NUM_DISTINCT) for _ in range(num_requests)]
    pairs = [distinct[index] for index in which]
    started = time.monotonic()
    alone = _reference(stack.address, distinct)
    reference = [alone[index] for index in which]
    reference_s = time.monotonic() - started
    wait_until_idle(stack)

    log_start = storm_stack.log_size()
    before = stack.metrics()
    plans = _storm_plans(pairs, CANCEL_FRACTION, seed + 1, spread=STORM_SPREAD)
    started = time.monotonic()
    outcomes = asyncio.run(run_round(stack.address, pairs, plans, in_flight))
    storm_s = time.monotonic() - started
    after = wait_until_idle(stack)

    by_status = Counter(outcome.status for outcome in outcomes)
    planned = sum(plan.kind != "none" for plan in plans)
    cancelled = [o for o in outcomes if o.status == "cancelled"]
    kinds = Counter(plans[o.index].kind for o in cancelled)
    mid_decode = sum(bool(o.token_ids) for o in cancelled)
    aborted = _finished(after, "abort") - _finished(before, "abort")
    leaked = after["cbserve_kv_blocks_used"]
    preempted = after["cbserve_num_preemptions_total"] - before["cbserve_num_preemptions_total"]
    print(
        f"\nstorm: requests={num_requests} in_flight={in_flight or num_requests} "
        f"planned_cancels={planned} cancelled={by_status['cancelled']} "
        f"completed={by_status['completed']} errors={by_status['error']} "
        f"cancelled_by_kind={dict(kinds)} cancelled_before_first_token="
        f"{len(cancelled) - mid_decode} cancelled_mid_decode={mid_decode} "
        f"server_aborts={aborted:.0f} leaked_blocks={leaked:.0f} "
        f"preemptions={preempted:.0f} "
        f"distinct_prompts={NUM_DISTINCT} reference_s={reference_s:.1f} storm_s={storm_s:.1f}"
    )

    errors = [o for o in outcomes if o.status == "error"]
    assert not errors, errors[:5]
    # Every request ended: completed, or cancelled by its plan.
    assert by_status["completed"] + by_status["cancelled"] == num_requests
    assert all(plans[o.index].kind != "none" for o in cancelled)
    assert by_status["cancelled"] >= 0.8 * planned
    assert mid_decode > 0 and len(cancelled) > mid_decode
    for outcome in outcomes:
        expected = reference[outcome.index]
        if outcome.status == "completed":
            assert outcome.token_ids == expected, f"request {outcome.index} diverged"
            assert outcome.finish_reason == "LENGTH", outcome
        else:
            assert outcome.token_ids == expected[: len(outcome.token_ids)], outcome.index
    # The server saw each request that streamed a token end as an abort, nothing failed.
    assert aborted >= mid_decode
    assert _failed_total(after) == _failed_total(before)
    assert leaked == 0
    assert after["cbserve_num_requests_running"] == 0
    assert after["cbserve_num_requests_waiting"] == 0
    bad = bad_log_lines(storm_stack.log_text(log_start))
    assert not bad, "\n".join(bad[:20])


@pytest.mark.slow  # 16 s; test_cancellation.py keeps cancels in make test
def test_cancellation_storm_leaks_nothing_and_others_get_their_tokens(storm_stack, tokenizer):
    # A third of the load test's clients (50 of them cancelled): the slow tier's long
    # storm below runs 2,000.
    _storm(storm_stack, tokenizer, NUM_REQUESTS // 3, None, seed=1234)


@pytest.mark.slow
def test_long_cancellation_storm(storm_stack, tokenizer):
    _storm(storm_stack, tokenizer, 2000, NUM_REQUESTS, seed=4321)
