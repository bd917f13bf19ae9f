"""`python -m worker_svc` as a real process: ready line, Describe, health, Step, start errors."""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cbserve.ports import free_port
from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from tests.waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.model]

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120
# 135 GFLOP on one thread: well over half a second even at 200 GFLOP/s.
PREFILL_STARTED_CPU_S = 0.05
GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def decode(step_id: int, seq_id: int) -> pb.StepPlan:
    return pb.StepPlan(
        step_id=step_id,
        continuing_sequences=[pb.ContinuingSequence(seq_id=seq_id, num_scheduled_tokens=1)],
    )


def start_worker(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "worker_svc", "--host", "127.0.0.1", "--threads", "1", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("worker ready on "):
                return line.strip()
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(f"worker did not become ready: {proc.stderr.read()[-2000:]}")


@pytest.fixture(scope="module")
def worker():
    port = free_port()
    proc = start_worker("--port", str(port), "--num-kv-blocks", "32")
    line = wait_ready(proc)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield proc, port, line, channel
    channel.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


class PlanFeed:
    """A request stream fed one plan at a time, so that each result can be read before the next."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()

    def send(self, plan):
        self._queue.put(plan)

    def close(self):
        self._queue.put(None)

    def __iter__(self):
        while (plan := self._queue.get()) is not None:
            yield plan


def test_ready_line_and_describe(worker):
    _, port, line, channel = worker
    assert line.startswith(f"worker ready on 127.0.0.1:{port} model=")
    # float32 on the CPU: the C decode kernel (it builds wherever the tests run).
    assert "kv_blocks=32 block_size=16 backend=cpu kv_cache_dtype=float32" in line
    description = worker_pb2_grpc.WorkerStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    assert description.num_kv_blocks == 32 and description.block_size == 16
    assert description.vocab_size == 49152 and description.max_model_len == 8192
    assert description.attention_backend == "cpu" and description.device == "cpu"
    assert description.dtype in line and len(description.instance_id) == 32
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "cbserve.worker.v1.Worker"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_step_stream_and_reset_on_new_stream(worker):
    _, _, _, channel = worker
    stub = worker_pb2_grpc.WorkerStub(channel)
    first = PlanFeed()
    results = stub.Step(iter(first), timeout=120)
    prompt = [1, 504, 3458, 314, 253]
    first.send(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=7,
                    prompt_token_ids=prompt,
                    num_scheduled_tokens=len(prompt),
                    block_ids=[3],
                    sampling=GREEDY,
                )
            ],
        )
    )
    result = next(results)
    assert result.step_id == 1 and list(result.seq_ids) == [7] and result.num_tokens == 5
    first.send(
        pb.StepPlan(
            step_id=2,
            continuing_sequences=[pb.ContinuingSequence(seq_id=7, num_scheduled_tokens=1)],
        )
    )
    result = next(results)
    assert result.step_id == 2 and list(result.seq_ids) == [7] and result.forward_seconds > 0

    # A second stream starts empty, and ends the first one.
    second = PlanFeed()
    second_results = stub.Step(iter(second), timeout=120)
    second.send(
        pb.StepPlan(
            step_id=1,
            continuing_sequences=[pb.ContinuingSequence(seq_id=7, num_scheduled_tokens=1)],
        )
    )
    with pytest.raises(grpc.RpcError) as rejected:
        next(second_results)
    assert rejected.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown sequence 7" in rejected.value.details()
    with pytest.raises(grpc.RpcError) as superseded:
        next(results)
    assert superseded.value.code() == grpc.StatusCode.ABORTED
    first.close()
    second.close()


def _cpu_seconds(pid: int) -> float:
    """The user and system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        after_name = stat.read().rsplit(")", 1)[1].split()  # fields 3 (state) onwards
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


def test_health_answers_during_a_long_prefill(worker):
    proc, _, _, channel = worker
    idle_cpu_s = _cpu_seconds(proc.pid)
    feed = PlanFeed()
    results = worker_pb2_grpc.WorkerStub(channel).Step(iter(feed), timeout=120)
    prompt = [100 + i % 1000 for i in range(500)]
    feed.send(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=prompt,
                    num_scheduled_tokens=len(prompt),
                    block_ids=list(range(32)),
                    sampling=GREEDY,
                )
            ],
        )
    )
    # The prefill has started on the forward thread once the idle worker has burnt
    # PREFILL_STARTED_CPU_S of CPU: a 500-token prefill on one thread takes far longer.
    wait_until(
        "the prefill computing",
        lambda: _cpu_seconds(proc.pid) - idle_cpu_s >= PREFILL_STARTED_CPU_S,
        timeout_s=START_TIMEOUT,
        interval_s=0.005,
    )
    started = time.monotonic()
    health = health_pb2_grpc.HealthStub(channel)
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert time.monotonic() - started < 1.0
    assert next(results).num_tokens == 500
    feed.close()


def test_port_taken_exits_with_message(worker):
    _, port, _, _ = worker
    proc = start_worker("--port", str(port), "--num-kv-blocks", "4")
    _, stderr = proc.communicate(timeout=START_TIMEOUT)
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in stderr


def test_missing_model_exits_with_message(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = start_worker("--port", str(free_port()), "--model", str(missing))
    _, stderr = proc.communicate(timeout=START_TIMEOUT)
    assert proc.returncode != 0
    assert str(missing) in stderr and "cannot start" in stderr
