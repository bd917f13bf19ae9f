"""A scheduler comes up beside workers that are still loading, whatever the start order.

Real processes started the way a shell script, a process manager or a compose file
without health conditions starts them: at once, or the worker half a second before the
scheduler, or a second worker long after. The scheduler must not exit: it serves once a
worker answers (health NOT_SERVING until then), says whom it waits for, and takes in a
late worker when it has loaded.
"""

from __future__ import annotations

import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cbserve.client import Client
from cbserve.local_stack import ChildProcess, free_port
from tests.waiting import wait_until

HOST = "127.0.0.1"
# A cold worker on 2 busy cores may take a while to load; the scheduler waits this long.
CONNECT_TIMEOUT_S = 240


def _worker(name: str, port: int) -> ChildProcess:
    argv = [sys.executable, "-m", "worker_svc", "--host", HOST, "--port", str(port)]
    argv += ["--dtype", "float32", "--num-kv-blocks", "64", "--grace-period", "1"]
    return ChildProcess(name, argv)


def _scheduler(port: int, worker_ports: list[int]) -> ChildProcess:
    argv = [sys.executable, "-m", "scheduler_svc", "--host", HOST, "--port", str(port)]
    argv += ["--metrics-port", "0", "--grace-period", "1"]
    argv += ["--worker-connect-timeout", str(CONNECT_TIMEOUT_S)]
    for worker_port in worker_ports:
        argv += ["--worker", f"{HOST}:{worker_port}"]
    return ChildProcess("scheduler", argv)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _answers(address: str) -> str:
    with Client(address, retry=None) as client:
        completion = client.complete("The capital of France is", max_tokens=4, temperature=0)
    assert completion.finish_reason
    return completion.text


def _connected_workers(address: str) -> list[str]:
    with Client(address, retry=None) as client:
        return list(client.model_info().workers)


def _stop(*children: ChildProcess) -> None:
    for child in children:
        child.stop(timeout_s=5)


@pytest.mark.parametrize("scheduler_first", [True, False], ids=["scheduler-first", "worker-first"])
def test_scheduler_serves_once_a_loading_worker_is_ready(scheduler_first):
    worker_port, scheduler_port = free_port(), free_port()
    address = f"{HOST}:{scheduler_port}"
    if scheduler_first:
        scheduler = _scheduler(scheduler_port, [worker_port])
        time.sleep(0.5)
        worker = _worker("worker", worker_port)
    else:
        worker = _worker("worker", worker_port)
        time.sleep(0.5)
        scheduler = _scheduler(scheduler_port, [worker_port])
    try:
        # Listening, not serving, and still alive while the worker loads.
        wait_until("the scheduler listens", lambda: _try_health(address) is not None, 60, 0.2)
        if not worker._ready.is_set():
            assert _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        worker.wait_ready()
        scheduler.wait_ready()
        assert scheduler.process.poll() is None
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        assert _answers(address)
    finally:
        _stop(scheduler, worker)


def test_a_worker_that_loads_late_joins_the_pool():
    early_port, late_port, scheduler_port = free_port(), free_port(), free_port()
    address = f"{HOST}:{scheduler_port}"
    early = _worker("early", early_port)
    scheduler = _scheduler(scheduler_port, [early_port, late_port])
    late = None
    try:
        # Serves with the early worker while the late one has not even started.
        scheduler.wait_ready()
        assert _connected_workers(address) == [f"{HOST}:{early_port}"]
        assert _answers(address)
        late = _worker("late", late_port)
        late.wait_ready()
        wait_until(
            "the late worker is connected",
            lambda: len(_connected_workers(address)) == 2,
            30,
            0.5,
        )
        assert scheduler.process.poll() is None
    finally:
        _stop(scheduler, early, *([late] if late else []))


def _try_health(address: str) -> int | None:
    try:
        return _health(address)
    except grpc.RpcError:
        return None
