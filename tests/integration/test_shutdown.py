"""Signals: graceful shutdown on SIGTERM, and a scheduler killed and restarted.

Each test starts (and kills) processes of its own, never the session stacks.
What a client sees:
- scheduler SIGTERM: health NOT_SERVING at once, new calls UNAVAILABLE, calls in
  flight finish normally within --grace-period (past it they end UNAVAILABLE),
  then exit code 0;
- worker SIGTERM: health NOT_SERVING, the scheduler's stream is ended after the
  grace period, exit code 0;
- scheduler SIGKILL: streams in flight and new calls end UNAVAILABLE (never a
  hang); the workers drop their state and wait, and a scheduler restarted on the
  same port serves through them, with no worker restarted.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import grpc
import pytest

from cbserve.client import Client
from cbserve.local_stack import ChildProcess, LocalStack, free_port
from cbserve.v1 import generation_pb2 as pb
from common.health_probe import check
from tests.integration.split import null_worker_args
from tests.waiting import wait_until

WORKER_ARGS = ["--dtype", "float32"]
# The SIGTERM tests are about the processes' signals, not what a step computes: their
# workers are null workers (no weights to load, a fixed step time; worker_svc/null),
# served and signalled as a model's. The SIGKILL test keeps a model's worker, whose
# state (KV blocks, sequences) must be dropped for the restarted scheduler.
NULL_STEP_MS = 20
NULL_WORKER_ARGS = null_worker_args(NULL_STEP_MS)
# In flight when the signal comes and through the health and UNAVAILABLE checks
# after it (a few RPCs: tens of milliseconds): 63 decode steps after the first token
# cannot all be done first unless a step takes under about 1.5 ms (a null worker's
# take NULL_STEP_MS). Short enough for CPU tests (16 tokens, as before, are done in
# 0.1 s by a forward as fast as llama.cpp's here, before the checks).
LONG_TOKENS = 64
# Generous: on a loaded CI machine a decode step can take seconds.
EXIT_TIMEOUT_S = 60
GRACE_S = 180


def _long_request(max_tokens: int = LONG_TOKENS) -> dict:
    return {"prompt": "Count to one hundred:", "max_tokens": max_tokens, "ignore_eos": True}


class StreamInThread:
    """A Generate call consumed in a thread: its responses, and how it ended."""

    def __init__(self, address: str, **kwargs) -> None:
        self.client = Client(address)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.error: grpc.RpcError | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)
        self._thread.start()

    def _run(self, kwargs: dict) -> None:
        try:
            for response in self.client.generate(timeout=GRACE_S, temperature=0.0, **kwargs):
                self.tokens.extend(response.token_ids)
                self.started.set()
                if response.finish_reason:
                    self.finish_reason = response.finish_reason
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.started.set()

    def wait(self, timeout_s: float = GRACE_S) -> StreamInThread:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream hung"
        self.client.close()
        return self


def _health(address: str) -> str:
    return check(address, timeout=2.0)[1]


def _unavailable(address: str) -> grpc.RpcError:
    with Client(address, retry=None) as client, pytest.raises(grpc.RpcError) as raised:
        client.complete("Hello", max_tokens=2, timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value
    return raised.value


def test_scheduler_sigterm_finishes_in_flight_and_refuses_new():
    with LocalStack(worker_args=NULL_WORKER_ARGS, grace_period_s=GRACE_S) as stack:
        streams = [StreamInThread(stack.address, **_long_request()) for _ in range(2)]
        for stream in streams:
            assert stream.started.wait(GRACE_S)
        stack.scheduler.process.send_signal(signal.SIGTERM)
        wait_until("NOT_SERVING", lambda: "NOT_SERVING" in _health(stack.address), 10.0)
        assert "shutting down" in _unavailable(stack.address).details()
        for stream in streams:
            stream.wait()
            assert stream.error is None, stream.error
            assert stream.finish_reason == pb.LENGTH
            assert len(stream.tokens) == LONG_TOKENS
        assert stack.scheduler.process.wait(EXIT_TIMEOUT_S) == 0


def test_scheduler_sigterm_ends_requests_past_grace_with_unavailable():
    with LocalStack(worker_args=NULL_WORKER_ARGS, grace_period_s=1) as stack:
        stream = StreamInThread(stack.address, **_long_request(max_tokens=4000))
        assert stream.started.wait(GRACE_S)
        began = time.monotonic()
        stack.scheduler.process.send_signal(signal.SIGTERM)
        stream.wait()
        assert stream.error is not None
        assert stream.error.code() == grpc.StatusCode.UNAVAILABLE, stream.error
        assert stack.scheduler.process.wait(EXIT_TIMEOUT_S) == 0
        assert time.monotonic() - began < 1 + EXIT_TIMEOUT_S


def test_worker_sigterm_drains_and_exits_zero():
    with LocalStack(worker_args=NULL_WORKER_ARGS, grace_period_s=2) as stack:
        worker = stack.workers[0]
        worker_address = f"{stack.host}:{stack.worker_ports[0]}"
        assert "SERVING" in _health(worker_address)
        worker.process.send_signal(signal.SIGTERM)
        # The scheduler's stream stays open: the worker waits out its grace
        # period, NOT_SERVING, then ends the stream itself and exits 0.
        wait_until("NOT_SERVING", lambda: "NOT_SERVING" in _health(worker_address), 10.0)
        assert worker.process.wait(EXIT_TIMEOUT_S) == 0


def test_worker_sigterm_without_scheduler_exits_at_once():
    port = free_port()
    worker = ChildProcess(
        "worker",
        [sys.executable, "-m", "worker_svc", "--host", "127.0.0.1", "--port", str(port)]
        + NULL_WORKER_ARGS
        + ["--grace-period", "60"],
    )
    try:
        worker.wait_ready()
        began = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(EXIT_TIMEOUT_S) == 0
        assert time.monotonic() - began < 10
    finally:
        worker.stop()


def test_scheduler_sigkill_then_restart_serves_through_the_same_workers():
    with LocalStack(num_workers=2, worker_args=WORKER_ARGS) as stack:
        worker_pids = [worker.process.pid for worker in stack.workers]
        stream = StreamInThread(stack.address, **_long_request(max_tokens=4000))
        assert stream.started.wait(GRACE_S)
        stack.scheduler.process.send_signal(signal.SIGKILL)
        stream.wait()
        assert stream.error is not None, "the stream of a killed scheduler must fail"
        assert stream.error.code() == grpc.StatusCode.UNAVAILABLE, stream.error
        _unavailable(stack.address)

        # Same port, same workers: nothing else is restarted.
        stack.scheduler = ChildProcess("scheduler", stack.scheduler.argv)
        stack.scheduler.wait_ready(120)
        with Client(stack.address) as client:
            completion = client.complete(
                "Hello", max_tokens=8, ignore_eos=True, temperature=0.0, timeout=60
            )
            assert len(completion.token_ids) == 8
            assert client.model_info().num_workers == 2
        assert [worker.process.pid for worker in stack.workers] == worker_pids
        assert all(worker.process.poll() is None for worker in stack.workers)
