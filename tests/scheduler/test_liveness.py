"""Worker liveness in the scheduler: how a lost worker is found, named and taken
back, against a fake worker behind a real gRPC server on loopback (the real
processes, with SIGKILL, SIGSTOP and a dropped network, are in
tests/integration/test_worker_liveness.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health, health_pb2
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from cbserve.v1 import generation_pb2 as pb
from common.errors import ServiceError
from common.grpc_options import channel_options
from common.grpc_status import CORE_INTERNAL_ERROR
from common.metrics import parse_samples
from scheduler_svc.api.request_trace import RequestTrace
from scheduler_svc.api.server import GenerationService
from scheduler_svc.api.serving_status import follow_workers
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.core.plan import StepPlan
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers import liveness
from scheduler_svc.workers.client import WorkerClient, WorkerLost
from scheduler_svc.workers.liveness import (
    FIRST_HOLD_OUT_S,
    MAX_HOLD_OUT_S,
    RETRY_DELAYS_S,
    STABLE_AFTER_S,
    Comeback,
    LossCause,
    cause_of,
)
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import FakeClock, load_tokenizer


def _plan(step_id: int) -> StepPlan:
    """A plan that drops nothing and computes nothing: valid on any stream."""
    return StepPlan(step_id=step_id)


async def _eventually(check, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never became true")


def test_the_step_deadline_grows_with_the_tokens_of_the_step():
    faults = FaultConfig(worker_timeout_s=3.0, step_seconds_per_token=0.01)
    assert faults.step_deadline_s(1) == pytest.approx(3.01)
    assert faults.step_deadline_s(2048) == pytest.approx(23.48)
    for bad in ({"worker_timeout_s": 1.0}, {"worker_timeout_s": 0}, {"step_seconds_per_token": -1}):
        with pytest.raises(ValueError):
            FaultConfig(**bad)


def test_keepalive_answers_within_the_worker_timeout():
    options = dict(channel_options(3.0))
    assert options["grpc.keepalive_time_ms"] + options["grpc.keepalive_timeout_ms"] == 3000
    # grpc times a keepalive ping out after this one, not keepalive_timeout_ms alone.
    assert options["grpc.http2.ping_timeout_ms"] == options["grpc.keepalive_timeout_ms"]
    assert options["grpc.http2.max_pings_without_data"] == 0


def test_causes_are_read_from_the_status_grpc_ended_the_stream_with():
    def error(code, details):
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    unavailable = grpc.StatusCode.UNAVAILABLE
    assert cause_of(error(unavailable, "Stream removed (ping timeout)")) is LossCause.KEEPALIVE
    assert cause_of(error(unavailable, "Socket closed")) is LossCause.DISCONNECTED
    assert cause_of(error(grpc.StatusCode.CANCELLED, "")) is LossCause.DISCONNECTED
    assert cause_of(error(grpc.StatusCode.INTERNAL, "step failed")) is LossCause.PROTOCOL
    # grpc's core's own words for a connection that broke under the stream.
    broke = error(grpc.StatusCode.INTERNAL, CORE_INTERNAL_ERROR)
    assert cause_of(broke) is LossCause.DISCONNECTED
    assert cause_of(error(grpc.StatusCode.ABORTED, "superseded")) is LossCause.PROTOCOL


def test_a_worker_lost_again_soon_after_it_came_back_is_held_out_longer_each_time():
    clock = FakeClock()
    comeback = Comeback(clock)
    comeback.connected()
    clock.advance(5)
    # Lost soon after the scheduler started: not flapping.
    assert comeback.lost() == RETRY_DELAYS_S[0]
    holds = []
    for _ in range(8):
        comeback.connected()
        clock.advance(10)
        holds.append(comeback.lost())
    assert holds[:3] == [FIRST_HOLD_OUT_S, 2 * FIRST_HOLD_OUT_S, 4 * FIRST_HOLD_OUT_S]
    assert holds == sorted(holds) and holds[-1] == MAX_HOLD_OUT_S
    # Up for a while: forgiven.
    comeback.connected()
    clock.advance(STABLE_AFTER_S + 1)
    assert comeback.lost() == RETRY_DELAYS_S[0]
    delays = Comeback.retry_delays()
    assert [next(delays) for _ in range(6)] == [*RETRY_DELAYS_S[1:], RETRY_DELAYS_S[-1], 8.0]


def test_an_idle_stream_that_breaks_is_reported_at_once_without_a_step():
    async def scenario():
        worker = await GrpcFakeWorker().start()
        reports: list[WorkerLost] = []
        client = WorkerClient(worker.address, 10.0, on_lost=reports.append)
        await client.connect(5.0)
        assert (await client.step(_plan(1), 5.0)).step_id == 1
        await worker.stop()
        await _eventually(lambda: reports)
        assert len(reports) == 1 and reports[0].cause is LossCause.DISCONNECTED
        with pytest.raises(WorkerLost):
            await client.step(_plan(2), 5.0)
        await client.close()

    asyncio.run(scenario())


def test_a_step_past_its_deadline_is_a_hang_and_its_late_result_reaches_nobody():
    async def scenario():
        worker = await GrpcFakeWorker().start()
        reports: list[WorkerLost] = []
        client = WorkerClient(worker.address, 10.0, on_lost=reports.append)
        await client.connect(5.0)
        worker.delay_s = 0.5
        with pytest.raises(WorkerLost) as lost:
            await client.step(_plan(1), 0.1)
        assert lost.value.cause is LossCause.STEP_TIMEOUT
        await asyncio.sleep(0.8)  # the late result arrives on the stream given up
        assert [report.cause for report in reports] == [LossCause.STEP_TIMEOUT]
        with pytest.raises(WorkerLost):
            await client.step(_plan(2), 5.0)
        # Reconnected: a new stream (the worker starts empty), step ids from 1 again.
        worker.delay_s = 0.0
        await client.connect(5.0)
        result = await client.step(_plan(1), 5.0)
        assert (result.step_id, result.num_tokens) == (1, 2)  # answered on stream 2
        await client.close()
        await worker.stop()

    asyncio.run(scenario())


def test_an_answer_to_another_step_is_a_protocol_loss():
    async def scenario():
        worker = await GrpcFakeWorker().start()
        worker.step_id_offset = 7
        client = WorkerClient(worker.address, 10.0)
        await client.connect(5.0)
        with pytest.raises(WorkerLost) as lost:
            await client.step(_plan(1), 5.0)
        assert lost.value.cause is LossCause.PROTOCOL
        await client.close()
        await worker.stop()

    asyncio.run(scenario())


def test_an_idle_engine_whose_worker_dies_is_disconnected_counted_and_not_serving():
    """Never used: the loss is found by the stream's reader, with no step in flight."""

    async def status(servicer):
        request = health_pb2.HealthCheckRequest(service="")
        return (await servicer.Check(request, None)).status

    async def scenario():
        worker = await GrpcFakeWorker().start()
        metrics = SchedulerMetrics(model_name="fake")
        pool = WorkerPool(
            SchedulerConfig(),
            load_tokenizer(),
            metrics,
            faults=FaultConfig(worker_timeout_s=2.0, worker_wait_timeout_s=5.0),
        )
        metrics.watch(pool)
        servicer = health.aio.HealthServicer()
        following = asyncio.create_task(follow_workers(pool, servicer, []))
        await pool.start([worker.address], 5.0)
        (engine,) = pool.engines.values()
        await _eventually(lambda: engine.connected)
        serving = health_pb2.HealthCheckResponse.SERVING
        await _eventually(lambda: not pool.changed.is_set())
        assert await status(servicer) == serving
        with capture_logs() as logs:
            await worker.stop()
            await _eventually(lambda: not engine.connected, timeout_s=1.0)
            await _eventually(lambda: any(e["event"] == "worker lost" for e in logs))
            await asyncio.sleep(0.1)
        (lost,) = [entry for entry in logs if entry["event"] == "worker lost"]
        assert lost["cause"] == "disconnected" and lost["worker"] == worker.address
        samples = parse_samples(generate_latest(metrics.registry).decode())
        assert samples['cbserve_worker_lost_total{cause="disconnected"}'] == 1
        assert samples['cbserve_worker_lost_total{cause="keepalive"}'] == 0
        assert samples[f'cbserve_worker_connected{{worker="{worker.address}"}}'] == 0
        for _ in range(100):
            if await status(servicer) == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.01)
        assert await status(servicer) == health_pb2.HealthCheckResponse.NOT_SERVING
        # The worker comes back on its port: reconnected, empty, and serving again.
        await worker.start(worker.port)
        await _eventually(lambda: engine.connected, timeout_s=10.0)
        assert engine.num_running == engine.num_waiting == engine.num_used_blocks == 0
        following.cancel()
        await pool.stop()
        await worker.stop()

    asyncio.run(scenario())


def test_a_flapping_engine_waits_longer_before_each_reconnect(monkeypatch):
    monkeypatch.setattr(liveness, "RETRY_DELAYS_S", (0.05, 0.05))
    monkeypatch.setattr(liveness, "FIRST_HOLD_OUT_S", 0.3)

    async def scenario():
        worker = await GrpcFakeWorker().start()
        pool = WorkerPool(SchedulerConfig(), load_tokenizer())
        await pool.start([worker.address], 5.0)
        (engine,) = pool.engines.values()
        away_s = []
        for _ in range(3):
            await worker.stop()
            await _eventually(lambda: not engine.connected)
            lost = asyncio.get_running_loop().time()
            await worker.start(worker.port)
            await _eventually(lambda: engine.connected, timeout_s=10.0)
            away_s.append(asyncio.get_running_loop().time() - lost)
        # First loss: back at once; then held out 0.3 s, then 0.6 s (seen from
        # here a poll later than the engine saw the loss).
        assert away_s[0] < 0.25 < away_s[1] < 0.55 < away_s[2], away_s
        await pool.stop()
        await worker.stop()

    asyncio.run(scenario())


def test_requests_waiting_for_a_worker_count_against_max_waiting_requests():
    async def scenario():
        tokenizer = load_tokenizer()
        pool = WorkerPool(SchedulerConfig(), tokenizer)
        # A worker was connected once (its limits are known); none is now.
        pool._known_descriptions["gone"] = SimpleNamespace(
            max_model_len=256, vocab_size=49152, num_kv_blocks=64, block_size=4
        )
        service = GenerationService(pool, tokenizer, max_waiting_requests=1)
        deadline = time.monotonic() + 30.0

        async def place(prompt: str):
            request = pb.GenerateRequest(prompt=prompt, sampling=pb.SamplingParams(max_tokens=4))
            return await service._place(request, deadline, RequestTrace(service.metrics))

        _, handle = await place("wait for a worker")
        queue = handle.queue
        assert handle.holder is pool.orphans and pool.num_waiting == 1 and queue.empty()
        with pytest.raises(ServiceError) as refused:
            await place("one too many")
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        await pool.stop()
        assert isinstance(queue.get_nowait(), ServiceError)

    asyncio.run(scenario())
