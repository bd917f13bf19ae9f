"""Chaos: three workers serve a stream of requests while, at moments drawn from
a fixed seed, one of them is killed (and restarted on its port) or stopped
(and resumed).

Every request must end OK (none waits for its deadline because a worker was
lost), greedy ones with exactly the tokens of a run without faults; each fault
must count as exactly one loss (no healthy worker is taken for lost under
load); and at the end every worker is back, no KV block is held and nothing
waits or runs. Faults are placed by progress (after so many requests have
finished), not by the clock, so that the run means the same on any CPU.

The default-suite run sends 24 requests over about 10 s with three faults (seed 13:
a stop, a kill, a stop, the same kinds on the same workers as its 60-request run; 2.4
requests a second, for the suite's time); the `slow` ones send 60 over about 40 s, and
200 over about two minutes with six faults (1.5 requests a second).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field

import grpc
import pytest

from cbserve.client import AsyncClient
from cbserve.local_stack import LocalStack
from tests.integration.liveness import (
    GREEDY,
    WORKER_ARGS,
    WORKER_TIMEOUT_S,
    Outcome,
    losses,
    requests_recomputed,
    restart_worker,
    run_greedy,
    stream,
    wait_until,
    worker_connected,
)
from tests.integration.stacks import wait_until_idle
from tests.waiting import wait_until_async

SLACK_S = 1.5
GREEDY_TOKENS = 16
DEADLINE_S = 120.0
PROMPTS = [
    f"Note {index}: {text}"
    for index, text in enumerate(
        [
            "the tide comes in twice a day because",
            "a good bread needs flour, water and",
            "the oldest tree in the park was planted",
            "to fix a flat bicycle tyre, first",
            "the museum opens at nine and the guide",
            "on the night train north the passengers",
            "a lighthouse keeper writes in the log that",
            "the recipe for the soup begins with",
        ]
    )
]


@dataclass
class Fault:
    kind: str  # "kill" (then a restart on the same port) or "stop" (then SIGCONT)
    worker: int
    # Requests finished when it comes, and (a stop) when the worker is resumed.
    at_finished: int
    resume_after: int = 0
    detected_s: float = 0.0
    back_s: float = 0.0


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    greedy: list[int | None] = field(default_factory=list)  # prompt index, None if sampled
    faults: list[Fault] = field(default_factory=list)
    finished: int = 0


def _plan(rng: random.Random, num_requests: int, num_faults: int) -> list[Fault]:
    kinds = ["kill", "stop"] + [rng.choice(["kill", "stop"]) for _ in range(num_faults - 2)]
    rng.shuffle(kinds)
    # Spread over the middle of the run, so that each hits requests in flight.
    points = sorted(rng.sample(range(num_requests // 10, num_requests * 8 // 10), num_faults))
    return [
        Fault(kind, rng.randrange(3), point, resume_after=rng.randint(2, 8))
        for kind, point in zip(kinds, points, strict=True)
    ]


async def _apply(stack: LocalStack, fault: Fault, run: Run, timeout_s: float) -> None:
    address = f"127.0.0.1:{stack.worker_ports[fault.worker]}"
    process = stack.workers[fault.worker].process
    process.send_signal(signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
    started = time.monotonic()
    fault.detected_s = await asyncio.to_thread(
        wait_until, f"{address} lost", lambda: not worker_connected(stack, address)
    )
    if fault.kind == "kill":
        await asyncio.to_thread(restart_worker, stack, fault.worker)
    else:
        resume_at = run.finished + fault.resume_after
        await wait_until_async(
            f"{fault.resume_after} more requests finished, to resume {address}",
            lambda: run.finished >= min(resume_at, len(run.outcomes)) or _all_done(run),
            timeout_s,
            interval_s=0.05,
        )
        process.send_signal(signal.SIGCONT)
    await asyncio.to_thread(wait_until, f"{address} back", lambda: worker_connected(stack, address))
    fault.back_s = time.monotonic() - started


def _all_done(run: Run) -> bool:
    return all(outcome.code is not None for outcome in run.outcomes)


async def _chaos(stack: LocalStack, seed: int, num_requests: int, duration_s: float, faults: int):
    rng = random.Random(seed)
    run = Run(faults=_plan(rng, num_requests, faults))
    run.outcomes = [Outcome() for _ in range(num_requests)]

    def count(outcome: Outcome) -> None:
        if outcome.finish_reason:
            run.finished += 1

    # Every request is sent by duration_s, and ends within its deadline after that.
    progress_timeout_s = duration_s + DEADLINE_S

    async def driver() -> None:
        for fault in run.faults:
            await wait_until_async(
                f"{fault.at_finished} requests finished, to {fault.kind} worker{fault.worker}",
                lambda fault=fault: run.finished >= fault.at_finished,
                progress_timeout_s,
                interval_s=0.05,
            )
            await _apply(stack, fault, run, progress_timeout_s)

    async with AsyncClient(stack.address) as client:
        chaos = asyncio.create_task(driver())
        tasks = []
        for outcome in run.outcomes:
            if rng.random() < 2 / 3:
                index = rng.randrange(len(PROMPTS))
                run.greedy.append(index)
                sampling = {"max_tokens": GREEDY_TOKENS, **GREEDY}
            else:
                index = rng.randrange(len(PROMPTS))
                run.greedy.append(None)
                sampling = {
                    "max_tokens": rng.randint(4, 24),
                    "temperature": 0.8,
                    "seed": rng.randrange(1000),
                }
            prompt = PROMPTS[index]
            tasks.append(
                asyncio.create_task(
                    stream(client, prompt, outcome, count, timeout=DEADLINE_S, **sampling)
                )
            )
            # Poisson arrivals over duration_s: the pace of the load is what is run,
            # not a stand-in for a state (faults wait for progress, above).
            await asyncio.sleep(rng.expovariate(num_requests / duration_s))
        await asyncio.gather(*tasks)
        await chaos
    return run


@pytest.fixture(scope="module")
def three_workers():
    with LocalStack(
        num_workers=3,
        worker_args=WORKER_ARGS,
        scheduler_args=["--worker-timeout", str(WORKER_TIMEOUT_S)],
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def reference(three_workers):
    outcomes, _ = run_greedy(three_workers.address, PROMPTS, GREEDY_TOKENS)
    assert all(o.finish_reason for o in outcomes)
    return [o.tokens for o in outcomes]


def _check(stack: LocalStack, run: Run, reference, losses_before, recomputed_before) -> None:
    codes = [outcome.code for outcome in run.outcomes]
    assert codes.count(grpc.StatusCode.OK) == len(codes), {c: codes.count(c) for c in set(codes)}
    for outcome, index in zip(run.outcomes, run.greedy, strict=True):
        assert outcome.finish_reason
        assert outcome.seconds < DEADLINE_S
        if index is not None:
            assert outcome.tokens == reference[index]
    lost = losses(stack)
    new = {cause: lost[cause] - losses_before[cause] for cause in lost}
    kills = sum(fault.kind == "kill" for fault in run.faults)
    assert new["disconnected"] == kills, new
    assert new["keepalive"] + new["step_timeout"] == len(run.faults) - kills, new
    assert new["protocol"] == 0, new
    for fault in run.faults:
        assert fault.detected_s <= WORKER_TIMEOUT_S + SLACK_S, fault
    assert all(worker_connected(stack, f"127.0.0.1:{port}") for port in stack.worker_ports)
    wait_until_idle(stack)
    print(
        f"\n[chaos] {len(run.outcomes)} requests, all OK; "
        f"recomputed={int(requests_recomputed(stack) - recomputed_before)}; faults: "
        + "; ".join(
            f"{f.kind} worker{f.worker} detected {f.detected_s:.2f}s back {f.back_s:.2f}s"
            for f in run.faults
        )
        + f"; slowest request {max(o.seconds for o in run.outcomes):.1f}s"
    )


def _chaos_test(stack, reference, seed, num_requests, duration_s, num_faults) -> None:
    wait_until("3 workers", lambda: all(
        worker_connected(stack, f"127.0.0.1:{port}") for port in stack.worker_ports
    ))  # fmt: skip
    losses_before, recomputed_before = losses(stack), requests_recomputed(stack)
    try:
        run = asyncio.run(_chaos(stack, seed, num_requests, duration_s, num_faults))
    finally:
        for child in stack.workers:
            child.process.send_signal(signal.SIGCONT)
    _check(stack, run, reference, losses_before, recomputed_before)


@pytest.mark.slow  # 34 s on 2 cores; single faults of each kind stay in make test
def test_chaos_24_requests_three_faults(three_workers, reference):
    _chaos_test(three_workers, reference, seed=13, num_requests=24, duration_s=10, num_faults=3)


@pytest.mark.slow
def test_chaos_60_requests_three_faults(three_workers, reference):
    _chaos_test(three_workers, reference, seed=13, num_requests=60, duration_s=40, num_faults=3)


@pytest.mark.slow
def test_chaos_200_requests_six_faults(three_workers, reference):
    _chaos_test(three_workers, reference, seed=7, num_requests=200, duration_s=120, num_faults=6)
