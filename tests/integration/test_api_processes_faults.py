"""--api-processes 2 when something stops: the core drained by SIGTERM, an API process
killed, a worker killed mid-run. Each test starts (and ends) a stack of its own on
null workers; every stream is on a connection of its own, so both API processes
serve some.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest

from cbserve.v1 import generation_pb2 as pb
from common.health_probe import check
from tests.integration.split import (
    API_PROCESSES,
    Stream,
    api_process_pids,
    log_lines,
    null_worker_args,
    served_by,
    session_processes,
    split_stack,
)
from tests.integration.stacks import stop_stack
from tests.waiting import wait_until_async

GRACE_S = 4.0
# A step of the drain's worker: SHORT_TOKENS of them end well inside GRACE_S, and
# LONG_TOKENS of them (40 s) never do.
DRAIN_STEP_MS = 10
SHORT_TOKENS = 60
LONG_TOKENS = 4000
# How long past its grace period the core may take to be gone (a loaded machine).
EXIT_SLACK_S = 30.0


@pytest.fixture
def stack_factory(tmp_path):
    started = []

    def start(**kwargs):
        stack = split_stack(tmp_path, **kwargs)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        stop_stack(stack)


def _gone(stack) -> int:
    """Waits for the core to exit; returns its exit code, once nothing of it is left."""
    core = stack.scheduler.process
    code = core.wait(GRACE_S + EXIT_SLACK_S)
    left = session_processes(core.pid)
    assert left == [], f"processes of the scheduler left running: {left}"
    return code


def _not_serving(stack, in_a_row: int):
    def check_all() -> bool:
        return all("NOT_SERVING" in check(stack.address, timeout=2)[1] for _ in range(in_a_row))

    return check_all


def test_sigterm_drains_both_api_processes_and_everything_exits(stack_factory):
    stack = stack_factory(
        worker_args=null_worker_args(DRAIN_STEP_MS),
        grace_period_s=GRACE_S,
    )
    assert len(api_process_pids(stack)) == API_PROCESSES
    short = [Stream(stack.address, max_tokens=SHORT_TOKENS, ignore_eos=True) for _ in range(8)]
    long = [Stream(stack.address, max_tokens=LONG_TOKENS, ignore_eos=True) for _ in range(2)]

    async def scenario():
        tasks = [asyncio.create_task(stream.run()) for stream in (*short, *long)]
        for stream in (*short, *long):
            await stream.started.wait()
        assert not any(stream.ended_at for stream in short), "started too late to drain"
        # To the core alone, as an orchestrator signals a container's first process.
        stack.scheduler.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Each check is a new connection: a run of them covers both processes.
        await wait_until_async("NOT_SERVING on 6 connections in a row", _not_serving(stack, 6))
        refused = [await Stream(stack.address, max_tokens=2).run() for _ in range(6)]
        await asyncio.gather(*tasks)
        return signalled, refused

    signalled, refused = asyncio.run(scenario())
    for stream in short:
        assert stream.code == grpc.StatusCode.OK, stream.details
        assert stream.finish_reason == pb.LENGTH and len(stream.tokens) == SHORT_TOKENS
    for stream in long:
        assert stream.code == grpc.StatusCode.UNAVAILABLE, stream.details
        assert GRACE_S - 0.5 <= stream.ended_at - signalled <= GRACE_S + EXIT_SLACK_S
    for stream in refused:
        assert stream.code == grpc.StatusCode.UNAVAILABLE and "shutting down" in stream.details
    assert _gone(stack) == 0
    drained = [line for line in log_lines(stack) if line.get("event") == "drained"]
    assert sorted(line["api_process"] for line in drained) == list(range(API_PROCESSES))
    assert sum(line["requests_cut"] for line in drained) == len(long)


def test_an_api_process_killed_stops_the_core_and_all_its_processes(stack_factory, tmp_path):
    # No worker: a scheduler following a name with no address behind it is ready at once.
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    stack = stack_factory(
        num_workers=0,
        scheduler_args=("--worker-dns", "nothing.test:1", "--worker-hosts-file", str(hosts)),
    )
    pids = api_process_pids(stack)
    assert len(pids) == API_PROCESSES
    os.kill(pids[0], signal.SIGKILL)
    assert _gone(stack) != 0
    assert any(line.get("event") == "API process exited" for line in log_lines(stack))
    assert not check(stack.address, timeout=2)[0]


def test_a_worker_killed_mid_run_loses_no_request(stack_factory):
    stack = stack_factory(num_workers=2)
    request_ids = [f"lost-worker-{i}" for i in range(16)]
    streams = [
        Stream(stack.address, request_id=rid, max_tokens=200, ignore_eos=True)
        for rid in request_ids
    ]

    async def scenario():
        tasks = [asyncio.create_task(stream.run()) for stream in streams]
        for stream in streams:
            await stream.started.wait()
        at_kill = [len(stream.tokens) for stream in streams]
        await asyncio.to_thread(stack.workers[0].stop, signal.SIGKILL)
        await asyncio.gather(*tasks)
        return at_kill

    at_kill = asyncio.run(scenario())
    assert max(at_kill) < 200, "every stream ended before the kill"
    for stream in streams:
        assert stream.code == grpc.StatusCode.OK, stream.details
        assert stream.finish_reason == pb.LENGTH and len(stream.tokens) == 200
    metrics = stack.metrics()
    assert metrics["cbserve_requests_recomputed_total"] > 0
    assert metrics["cbserve_workers_connected"] == 1
    assert set(served_by(stack, request_ids)) == set(range(API_PROCESSES))


def test_cbserve_drain_through_an_api_process_is_done_by_the_core(stack_factory, capsys):
    """AdminService on the API processes' port: forwarded to the core, whose pool drains
    the worker (null workers hold no KV to send: their requests are handed over by
    recompute, still losing nothing); its refusals come back with their status."""
    from cbserve import cli

    stack = stack_factory(num_workers=2)
    first, second = (f"127.0.0.1:{port}" for port in stack.worker_ports)
    request_ids = [f"drained-{i}" for i in range(8)]
    streams = [
        Stream(stack.address, request_id=rid, max_tokens=150, ignore_eos=True)
        for rid in request_ids
    ]

    def drain(worker: str) -> int:
        return cli.main(["drain", "--worker", worker, "--server", stack.address])

    async def scenario():
        tasks = [asyncio.create_task(stream.run()) for stream in streams]
        for stream in streams:
            await stream.started.wait()
        assert await asyncio.to_thread(drain, "nowhere:1") == 1
        assert "NOT_FOUND" in capsys.readouterr().err
        assert await asyncio.to_thread(drain, first) == 0
        assert f"drained {first}" in capsys.readouterr().out
        assert await asyncio.to_thread(drain, second) == 1
        assert "FAILED_PRECONDITION" in capsys.readouterr().err
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    for stream in streams:
        assert stream.code == grpc.StatusCode.OK, stream.details
        assert len(stream.tokens) == 150
    assert stack.metrics()["cbserve_requests_drained_total"] >= 1
