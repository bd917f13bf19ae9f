"""Dead and hung workers: no token lost or repeated, and UNAVAILABLE only when no
worker comes back within --worker-wait-timeout.

Real processes on loopback; faults are signals: SIGKILL (a dead worker: its
stream breaks), SIGSTOP (a hung one: its keepalive pings go unanswered for
--worker-timeout; tests/integration/test_worker_liveness.py times that).
Requests are greedy with ignore_eos, so a stream that was moved to another
worker must carry exactly the tokens of a run without a fault. Workers run one
thread each (two processes spinning in OpenMP on two cores are many times slower).
"""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from cbserve.local_stack import LocalStack
from tests.integration.liveness import WORKER_ARGS, bring_back_workers, restart_worker
from tests.waiting import wait_until

GREEDY = {"temperature": 0.0, "ignore_eos": True}
MAX_TOKENS = 24
PROMPTS = [
    f"Request {index}: tell a short story about a {animal}."
    for index, animal in enumerate(["cat", "dog", "fox", "owl", "bee", "elk"])
]
# Long enough for a killed worker to be restarted (it loads the model) within it.
WAIT_TIMEOUT_S = 15.0
# For the requests that must outwait it: a few seconds prove the wait as well as 15.
SHORT_WAIT_TIMEOUT_S = 3.0


def _connected_workers(stack: LocalStack) -> int:
    return sum(
        int(value)
        for name, value in stack.metrics().items()
        if name.startswith("cbserve_worker_connected{")
    )


def _wait_for_workers(stack: LocalStack, count: int, timeout_s: float = 60.0) -> None:
    wait_until(f"{count} connected workers", lambda: _connected_workers(stack) == count, timeout_s)


def _park_one(client: Client, pool: ThreadPoolExecutor) -> Future:
    """Sends copies of one request until the scheduler refuses a copy for its
    --max-concurrent-streams of 2: then the stream moved off the lost worker and one
    copy hold both, and that copy is parked waiting for a worker. Returns it, once
    every other copy has been refused (refused before anything else, none queues)."""
    copies: list[Future] = []

    def one_answered() -> bool:
        copies.append(pool.submit(client.complete, PROMPTS[1], max_tokens=8, timeout=120, **GREEDY))
        return any(copy.done() for copy in copies)

    wait_until("a copy answered", one_answered)
    wait_until("every copy but one answered", lambda: sum(not c.done() for c in copies) <= 1)
    answers = [copy.exception() for copy in copies if copy.done()]
    limit = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(error is not None and error.code() == limit for error in answers), answers
    (parked,) = (copy for copy in copies if not copy.done())
    return parked


def _reference(stack: LocalStack) -> list[list[int]]:
    """The same requests streamed at once, without a fault."""
    results, _ = asyncio.run(_stream_all(stack.address, lambda: None))
    assert all(finish is not None for _, finish in results)
    return [tokens for tokens, _ in results]


def _assert_same_tokens(results, at_fault, reference) -> None:
    for (tokens, finish), expected in zip(results, reference, strict=True):
        assert tokens == expected
        assert finish is not None
    # The fault came mid-decode: every stream had tokens, some were still going.
    assert all(count > 0 for count in at_fault)
    assert any(count < MAX_TOKENS for count in at_fault), at_fault


async def _stream_all(address: str, fault, after_tokens: int = 3):
    """Streams every prompt at once; calls fault() once every stream has `after_tokens`.

    Returns per prompt (token ids, finish reason), or (the gRPC status code it ended
    with, token ids); and how many tokens each stream had when the fault came.
    """
    started = [asyncio.Event() for _ in PROMPTS]
    streamed = [0 for _ in PROMPTS]

    async def one(client: AsyncClient, index: int):
        tokens: list[int] = []
        finish = None
        try:
            async for response in client.generate(PROMPTS[index], max_tokens=MAX_TOKENS, **GREEDY):
                tokens.extend(response.token_ids)
                streamed[index] = len(tokens)
                if len(tokens) >= after_tokens:
                    started[index].set()
                if response.finish_reason:
                    finish = response.finish_reason
        except grpc.aio.AioRpcError as error:
            started[index].set()
            return error.code(), tokens
        return tokens, finish

    async with AsyncClient(address) as client:
        tasks = [asyncio.create_task(one(client, index)) for index in range(len(PROMPTS))]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 120)
        at_fault = list(streamed)
        await asyncio.to_thread(fault)
        return await asyncio.wait_for(asyncio.gather(*tasks), 180), at_fault


@pytest.fixture(scope="module")
def reference(two_worker_stack):
    """On the session's two workers (conftest.py), which test_structured_faults kills
    too: `two_workers` brings back what a test before left down."""
    bring_back_workers(two_worker_stack)
    return _reference(two_worker_stack)


def test_a_killed_workers_requests_finish_on_the_other_with_the_same_tokens(two_workers, reference):
    _wait_for_workers(two_workers, 2)
    results, at_fault = asyncio.run(
        _stream_all(two_workers.address, lambda: two_workers.workers[0].process.kill())
    )
    _assert_same_tokens(results, at_fault, reference)
    # The lost worker comes back on its port: the scheduler reconnects, and the
    # next test puts half of its requests on it.
    restart_worker(two_workers, 0)
    _wait_for_workers(two_workers, 2)


# make test-slow (15 s): test_worker_liveness.py's SIGSTOP test, in make test, holds the
# same (no token lost, found within --worker-timeout, served again after SIGCONT) and times it.
@pytest.mark.slow
def test_a_hung_worker_counts_as_dead_after_the_worker_timeout(two_workers, reference):
    _wait_for_workers(two_workers, 2)
    hung = two_workers.workers[1].process
    try:
        results, at_fault = asyncio.run(
            _stream_all(two_workers.address, lambda: hung.send_signal(signal.SIGSTOP))
        )
    finally:
        hung.send_signal(signal.SIGCONT)
    _assert_same_tokens(results, at_fault, reference)
    # Woken up, it is reconnected (its old stream is superseded) and serves again.
    _wait_for_workers(two_workers, 2)
    assert _reference(two_workers) == reference


@pytest.fixture(scope="module")
def one_worker():
    with LocalStack(
        num_workers=1,
        worker_args=WORKER_ARGS,
        scheduler_args=["--worker-wait-timeout", str(WAIT_TIMEOUT_S)],
    ) as stack:
        yield stack


# make test-slow (15 s): make test keeps a new request waiting for a worker lost
# moments ago (below) and a late-loading worker joining the pool (test_start_order.py).
@pytest.mark.slow
def test_requests_wait_for_a_worker_that_comes_back(one_worker):
    _wait_for_workers(one_worker, 1)
    reference = _reference(one_worker)

    def kill_and_restart():
        one_worker.workers[0].process.kill()
        restart_worker(one_worker, 0)

    results, at_fault = asyncio.run(_stream_all(one_worker.address, kill_and_restart))
    _assert_same_tokens(results, at_fault, reference)


@pytest.fixture(scope="module")
def one_worker_two_streams():
    """One worker, and room for two Generate calls at once: see _park_one."""
    with LocalStack(
        num_workers=1,
        worker_args=WORKER_ARGS,
        scheduler_args=[
            "--worker-wait-timeout",
            str(WAIT_TIMEOUT_S),
            "--max-concurrent-streams",
            "2",
        ],
    ) as stack:
        yield stack


def test_a_new_request_waits_for_a_worker_lost_moments_ago(one_worker_two_streams):
    stack = one_worker_two_streams
    _wait_for_workers(stack, 1)
    with Client(stack.address, retry=None) as client:  # refusals are observed
        expected = client.complete(PROMPTS[1], max_tokens=8, timeout=60, **GREEDY).token_ids
        # The scheduler notices a dead worker when a step fails: kill it mid-decode.
        stream = client.generate(PROMPTS[2], max_tokens=64, timeout=120, **GREEDY)
        next(stream)
        stack.workers[0].process.kill()
        _wait_for_workers(stack, 0)
        with ThreadPoolExecutor(16) as pool:
            # Sent right after the loss, inside --worker-wait-timeout: it waits.
            waiting = _park_one(client, pool)
            assert not waiting.done()
            restart_worker(stack, 0)
            assert waiting.result().token_ids == expected
        assert sum(len(response.token_ids) for response in stream) == 63


@pytest.fixture(scope="module")
def one_worker_short_wait():
    """One worker, and a wait timeout no restart fits in: requests outwait it."""
    with LocalStack(
        num_workers=1,
        worker_args=WORKER_ARGS,
        scheduler_args=["--worker-wait-timeout", str(SHORT_WAIT_TIMEOUT_S)],
    ) as stack:
        yield stack


def test_with_no_worker_past_the_wait_timeout_requests_get_unavailable(one_worker_short_wait):
    """Requests without a deadline wait --worker-wait-timeout for a worker; a new
    request waits until its own deadline, and is served if a worker comes by then."""
    _wait_for_workers(one_worker_short_wait, 1)
    killed_at = []

    def kill():
        one_worker_short_wait.workers[0].process.kill()
        killed_at.append(time.monotonic())

    try:
        results, _ = asyncio.run(_stream_all(one_worker_short_wait.address, kill))
        ended = time.monotonic()
        for code, tokens in results:
            assert code == grpc.StatusCode.UNAVAILABLE
            assert 3 <= len(tokens) < MAX_TOKENS
        assert ended - killed_at[0] >= SHORT_WAIT_TIMEOUT_S - 1
        with Client(one_worker_short_wait.address) as client:
            # Past the wait timeout, a new request still waits: until its deadline...
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as expired:
                client.complete(PROMPTS[0], max_tokens=4, timeout=3, **GREEDY)
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - started >= 2.5
            # ... or until a worker comes, which then serves it.
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(
                    client.complete, PROMPTS[0], max_tokens=4, timeout=120, **GREEDY
                )
                restart_worker(one_worker_short_wait, 0)
                assert len(waiting.result().token_ids) == 4
    finally:
        if one_worker_short_wait.workers[0].process.poll() is not None:
            restart_worker(one_worker_short_wait, 0)
        _wait_for_workers(one_worker_short_wait, 1)
