"""Cancellation storms and load on real processes over loopback.

One stack for the module (`storm_stack`): a KV pool of 256 blocks (4096 tokens) and
at most 128 sequences per step, so that of 500 concurrent requests most wait, and
cancellations land while a request waits, while it is prefilled and while it
decodes (the prompts are a few tokens, so the pool is not full: no preemption).
`--max-concurrent-streams` is 600, so 500 streams fit (the refusal past the limit is
tested elsewhere).

- The storm: 500 concurrent greedy requests (ignore_eos, 4 to 8 tokens), 30% of
  them cancelled with `call.cancel()` at random moments: before they are sent,
  once the storm as a whole has streamed a random number of tokens (so the cancel
  finds the request waiting, prefilling or decoding, whatever the CPU's speed), or
  after their own first (or k-th) token. Every request not
  cancelled completes with exactly the tokens of the same prompt run without the
  storm (100 distinct prompts, run alone first); a cancelled one has streamed a
  prefix of them. Afterwards nothing runs,
  waits or holds a block, and the scheduler's stderr has no traceback.
- The load: two identical rounds of 500 concurrent streaming clients (4 tokens each,
  over 4 channels of one TCP connection each), each round bounded in time; all
  complete, and the scheduler's RSS (VmRSS of its process) after the second round
  is within 10% of the first.

The counts (requests, cancelled, completed, leaked blocks, RSS) are printed: run
with `pytest -s` to see them. Bigger variants (2000 requests, 500 at a time; five
load rounds) are marked `slow`: `make test-slow` runs them, `make test` does not.

The children's stderr is sent to a file while the stack starts (LocalStack lets it
through to ours), so that the tests can read the scheduler's logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import pytest

from cbserve.client import build_request
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.grpc_options import MESSAGE_SIZE_OPTIONS
from tests.integration.progress import TokenProgress
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle

POOL_BLOCKS = 256
MAX_NUM_SEQS = 128
MAX_CONCURRENT_STREAMS = 600
NUM_REQUESTS = 500
CANCEL_FRACTION = 0.3
# One step of 128 sequences takes about 1.5 s on two cores, so the
# requests are short: a 500-request round is a few dozen steps.
MIN_TOKENS, MAX_TOKENS = 4, 8
LOAD_TOKENS = 4
# Requests reuse this many distinct prompts, so the reference run is short.
NUM_DISTINCT = 100
NUM_CHANNELS = 4
# "storm_tokens" cancels fire before the storm has streamed this share of the tokens
# its requests ask for: counted in tokens, not seconds, so that they land on any CPU
# (timers of up to 15 s let 22% of the requests finish first on a fast one).
STORM_SPREAD = 0.5
# The bound on one round; on a quiet 2-core machine a round takes 30-40 s.
ROUND_TIMEOUT_S = 240.0
RSS_TOLERANCE = 0.10
GREEDY = {"temperature": 0.0, "ignore_eos": True}

# What must never appear in the scheduler's stderr.
BAD_LOG_MARKERS = ("Task exception was never retrieved", "Traceback", "exception was never")

_WORDS = (
    "river mountain lantern harbor orchard bridge meadow falcon copper violet",
    "winter summer engine garden market candle silver thunder planet forest",
    "island castle pepper marble anchor rocket ribbon saddle tunnel velvet",
)
_WORDS = [word for line in _WORDS for word in line.split()]
_TOPICS = (
    "Tell me about",
    "Write a short poem about",
    "Explain to a child what a",
    "List three facts about the",
    "Describe the color of a",
    "Why do people like the",
)


@dataclass
class StormStack:
    stack: object
    log_path: str

    def log_text(self, start: int = 0) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            log.seek(start)
            return log.read()

    def log_size(self) -> int:
        return os.path.getsize(self.log_path)


@contextlib.contextmanager
def _stderr_to(path: str):
    """Points fd 2 at `path` (children started meanwhile inherit it), then restores it."""
    saved = os.dup(2)
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@pytest.fixture(scope="module")
def storm_stack(tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("storm") / "children.stderr")
    with _stderr_to(log_path):
        running = started_stack(
            worker_args=["--dtype", "float32", "--num-kv-blocks", str(POOL_BLOCKS)],
            scheduler_args=[
                "--max-num-seqs",
                str(MAX_NUM_SEQS),
                "--max-concurrent-streams",
                str(MAX_CONCURRENT_STREAMS),
            ],
        )
    # One request first, so that the model's first (slow) steps are not in any timing.
    asyncio.run(_run_round(running.address, [([1, 2, 3], 2)], [Plan()]))
    yield StormStack(running, log_path)
    stop_stack(running)


def _prompts(tokenizer, count: int, seed: int) -> list[tuple[list[int], int]]:
    """`count` short, distinct (prompt token ids, max_tokens) pairs."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
        text = f"{rng.choice(_TOPICS)} {words}."
        pairs.append((tokenizer.encode(text), rng.randint(MIN_TOKENS, MAX_TOKENS)))
    return pairs


@dataclass
class Plan:
    """When one request is cancelled: never, before it is sent, once the whole storm
    has streamed `storm_tokens` tokens (at the latest before its own last token), or
    once it has streamed `after_tokens` tokens itself."""

    kind: str = "none"  # none | before_send | storm_tokens | after_tokens
    storm_tokens: int = 0
    after_tokens: int = 0


@dataclass
class Outcome:
    index: int
    status: str  # completed | cancelled | error
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    seconds: float = 0.0


def _channels(address: str, count: int) -> list[grpc.aio.Channel]:
    # Each channel its own subchannel pool: its own TCP connection to the scheduler.
    options = [*MESSAGE_SIZE_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    return [grpc.aio.insecure_channel(address, options=options) for _ in range(count)]


async def _one(
    stub,
    index: int,
    prompt: list[int],
    max_tokens: int,
    plan: Plan,
    timeout_s: float,
    progress: TokenProgress,
) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(index, "error")
    request = build_request(token_ids=prompt, max_tokens=max_tokens, **GREEDY)
    call = stub.Generate(request, timeout=timeout_s)
    # A storm_tokens cancel is due at the storm's count or before this request's own
    # last token, whichever comes first: on any CPU it finds the request unfinished.
    own_limit = {"after_tokens": plan.after_tokens, "storm_tokens": max_tokens - 1}
    if plan.kind == "before_send":
        call.cancel()
    elif plan.kind == "storm_tokens":
        progress.at(plan.storm_tokens, call.cancel)
    try:
        async for response in call:
            outcome.token_ids.extend(response.token_ids)
            progress.add(len(response.token_ids))
            if response.finish_reason:
                outcome.finish_reason = pb.FinishReason.Name(response.finish_reason)
            if plan.kind in own_limit and len(outcome.token_ids) >= own_limit[plan.kind]:
                call.cancel()
        outcome.status = "completed"
    except asyncio.CancelledError:
        if not call.cancelled():
            raise  # the test itself is being cancelled
        outcome.status = "cancelled"
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.CANCELLED and plan.kind != "none":
            outcome.status = "cancelled"
        else:
            outcome.error = f"{error.code().name}: {error.details()}"
    # A cancel that came after the last message still reads as a completion.
    if outcome.status == "cancelled" and outcome.finish_reason:
        outcome.status = "completed"
    outcome.seconds = time.monotonic() - started
    return outcome


async def _run_round(
    address: str,
    pairs: list[tuple[list[int], int]],
    plans: list[Plan],
    in_flight: int | None = None,
    timeout_s: float = ROUND_TIMEOUT_S,
) -> list[Outcome]:
    """Every request at once (or `in_flight` at a time), spread over a few channels."""
    channels = _channels(address, NUM_CHANNELS)
    stubs = [pb_grpc.GenerationStub(channel) for channel in channels]
    gate = asyncio.Semaphore(in_flight or len(pairs))
    progress = TokenProgress()

    async def gated(index: int) -> Outcome:
        async with gate:
            prompt, max_tokens = pairs[index]
            stub = stubs[index % len(stubs)]
            return await _one(stub, index, prompt, max_tokens, plans[index], timeout_s, progress)

    try:
        return await asyncio.wait_for(
            asyncio.gather(*(gated(i) for i in range(len(pairs)))), timeout_s
        )
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


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


def _bad_log_lines(text: str) -> list[str]:
    bad = []
    for line in text.splitlines():
        if any(marker in line for marker in BAD_LOG_MARKERS):
            bad.append(line)
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and (
                entry.get("level") in ("error", "critical", "exception") or "exception" in entry
            ):
                bad.append(line)
    return bad


def _reference(address: str, distinct) -> list[list[int]]:
    """The distinct prompts alone, none cancelled: the tokens each request must give."""
    outcomes = asyncio.run(_run_round(address, distinct, [Plan() for _ in distinct]))
    errors = [o for o in outcomes if o.status != "completed"]
    assert not errors, errors[:5]
    for outcome in outcomes:
        assert len(outcome.token_ids) == distinct[outcome.index][1], outcome
    return [outcome.token_ids for outcome in outcomes]


def _storm(storm_stack, tokenizer, num_requests: int, in_flight: int | None, seed: int):
    stack = storm_stack.stack
    distinct = _prompts(tokenizer, NUM_DISTINCT, seed)
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
    outcomes = asyncio.run(_run_round(stack.address, pairs, plans, in_flight))
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
    bad = _bad_log_lines(storm_stack.log_text(log_start))
    assert not bad, "\n".join(bad[:20])


def test_cancellation_storm_leaks_nothing_and_others_get_their_tokens(storm_stack, tokenizer):
    _storm(storm_stack, tokenizer, NUM_REQUESTS, None, seed=1234)


@pytest.mark.slow
def test_long_cancellation_storm(storm_stack, tokenizer):
    _storm(storm_stack, tokenizer, 2000, NUM_REQUESTS, seed=4321)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _load(storm_stack, tokenizer, rounds: int, seed: int) -> None:
    stack = storm_stack.stack
    pid = stack.scheduler.process.pid
    pairs = [(prompt, LOAD_TOKENS) for prompt, _ in _prompts(tokenizer, NUM_REQUESTS, seed)]
    plans = [Plan() for _ in pairs]
    log_start = storm_stack.log_size()
    rss: list[int] = []
    durations: list[float] = []
    first_tokens = None
    for number in range(1, rounds + 1):
        started = time.monotonic()
        outcomes = asyncio.run(_run_round(stack.address, pairs, plans))
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
    bad = _bad_log_lines(storm_stack.log_text(log_start))
    assert not bad, "\n".join(bad[:20])


def test_500_streaming_clients_complete_and_memory_stays_flat(storm_stack, tokenizer):
    _load(storm_stack, tokenizer, rounds=2, seed=99)


@pytest.mark.slow
def test_many_load_rounds_keep_memory_flat(storm_stack, tokenizer):
    _load(storm_stack, tokenizer, rounds=5, seed=98)
