"""The harness of the storm and load tests: one stack, many short streaming requests.

One stack for the package (`storm_stack`, in conftest): a KV pool of 256 blocks
(4096 tokens) and at most 128 sequences per step, so that of 500 concurrent
requests most wait, and cancellations land while a request waits, while it is
prefilled and while it decodes (the prompts are a few tokens, so the pool is not
full: no preemption). `--max-concurrent-streams` is 600, so 500 streams fit (the
refusal past the limit is tested elsewhere).

`run_round` sends a round of requests over a few channels, each with a `Plan` that
says whether and when it is cancelled, and returns one `Outcome` per request.

The children's stderr is sent to a file while the stack starts (LocalStack lets it
through to ours), so that the tests can read the scheduler's logs: `bad_log_lines`
picks what must never be there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from dataclasses import dataclass, field

import grpc

from cbserve.client import build_request
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.grpc_options import MESSAGE_SIZE_OPTIONS
from tests.integration.progress import TokenProgress

POOL_BLOCKS = 256
MAX_NUM_SEQS = 128
MAX_CONCURRENT_STREAMS = 600
NUM_REQUESTS = 500
# One step of 128 sequences takes about 1.5 s on two cores, so the
# requests are short: a 500-request round is a few dozen steps.
MIN_TOKENS, MAX_TOKENS = 4, 8
NUM_CHANNELS = 4
# The bound on one round; on a quiet 2-core machine a round takes 30-40 s.
ROUND_TIMEOUT_S = 240.0
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
def stderr_to(path: str):
    """Points fd 2 at `path` (children started meanwhile inherit it), then restores it."""
    saved = os.dup(2)
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def short_prompts(tokenizer, count: int, seed: int) -> list[tuple[list[int], int]]:
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


async def run_round(
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


def bad_log_lines(text: str) -> list[str]:
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
