"""The pool: placement (prefix hit, then load, then turns), workers joining and leaving,
and the health status that follows them. Engines are fakes here, except for the
prefix-cache lookup, which runs on a real Scheduler driven by the harness."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health, health_pb2
from prometheus_client import generate_latest

from common.errors import ServiceError
from common.metrics import parse_samples
from scheduler_svc.api.serving_status import follow_workers
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers import pool as worker_pool
from scheduler_svc.workers.client import WorkerLost
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.pool import WorkerPool

from .harness import Harness, make_request


class FakeEngine:
    """What the pool reads and calls on an engine; connects when `answer` is set."""

    instances: dict[str, FakeEngine] = {}

    def __init__(
        self, address, config, tokenizer, *, metrics=None, on_connection_change=None, **_hooks
    ):
        self.address = address
        self.connected = False
        self.draining = False
        self.stopped = False
        self.load = 0
        self.num_submitted = 0
        self.num_waiting = self.num_running = 0
        self.num_kv_blocks = self.num_used_blocks = self.num_cached_blocks = 0
        self.hit_tokens = 0
        self.capacity_tokens = 1000
        self.model = "m"
        self.stats = SchedulerStats(num_preemptions=2)
        self.answer = asyncio.Event()
        self._notify = on_connection_change
        self.client = SimpleNamespace(description=None)
        FakeEngine.instances[address] = self

    async def start(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.answer.wait(), timeout_s)
        except TimeoutError:
            raise WorkerLost(f"{self.address} unreachable") from None
        self.client.description = SimpleNamespace(model_name=self.model)
        self.connected = True
        self._notify(self)

    async def stop(self) -> None:
        self.stopped = True
        if self.connected:
            self.connected = False
            self._notify(self)

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.capacity_tokens

    def cached_prefix_tokens(self, token_ids) -> int:
        return self.hit_tokens


@pytest.fixture
def fake_engines(monkeypatch):
    FakeEngine.instances = {}
    monkeypatch.setattr(worker_pool, "WorkerEngine", FakeEngine)
    return FakeEngine.instances


def _connected_pool(*addresses: str) -> WorkerPool:
    pool = WorkerPool(SchedulerConfig(), tokenizer=None)
    for address in addresses:
        engine = pool._new_engine(address)
        engine.connected = True
    return pool


def test_placement_prefers_the_longest_cached_prefix(fake_engines):
    pool = _connected_pool("a", "b")
    fake_engines["a"].load = 0
    fake_engines["b"].load, fake_engines["b"].hit_tokens = 5, 32
    assert pool.pick([1] * 40, 100).address == "b"


def test_a_cached_prefix_does_not_pull_requests_into_a_backlog(fake_engines):
    pool = _connected_pool("a", "b")
    fake_engines["b"].load, fake_engines["b"].hit_tokens = 9, 32
    fake_engines["b"].num_waiting = 4  # requests already queue there
    assert pool.pick([1] * 40, 100).address == "a"
    fake_engines["b"].num_waiting = 0
    assert pool.pick([1] * 40, 100).address == "b"


def test_placement_then_prefers_the_least_loaded_then_takes_turns(fake_engines):
    pool = _connected_pool("a", "b")
    fake_engines["a"].load = 3
    assert pool.pick([1], 10).address == "b"
    fake_engines["a"].load = 0
    fake_engines["a"].num_submitted = 4
    fake_engines["b"].num_submitted = 5
    assert pool.pick([1], 10).address == "a"


def test_placement_skips_disconnected_workers_and_pools_too_small(fake_engines):
    pool = _connected_pool("a", "b", "c")
    fake_engines["a"].connected = False
    fake_engines["a"].hit_tokens = 64
    fake_engines["b"].capacity_tokens = 50
    assert pool.pick([1], 100).address == "c"
    fake_engines["c"].connected = False
    with pytest.raises(ServiceError) as raised:
        pool.pick([1], 100)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


def test_no_worker_at_all_is_unavailable(fake_engines):
    with pytest.raises(ServiceError) as raised:
        _connected_pool().pick([1], 1)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


def test_discovered_workers_connect_in_the_background_and_leave(fake_engines):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None, connect_timeout_s=0.05)
        pool.add("a")
        pool.add("a")  # already there: nothing new
        assert list(fake_engines) == ["a"]
        await asyncio.sleep(0.2)  # several attempts time out, none is fatal
        assert not pool.connected_engines()
        pool.changed.clear()
        fake_engines["a"].answer.set()
        await asyncio.wait_for(pool.changed.wait(), 5)
        assert [engine.address for engine in pool.connected_engines()] == ["a"]
        await pool.remove("a")
        assert fake_engines["a"].stopped and not pool.engines
        # Its counters stay in the totals.
        assert pool.retired_stats.num_preemptions == 2
        # A worker removed before it ever answered is stopped too.
        pool.add("b")
        await pool.remove("b")
        assert fake_engines["b"].stopped and not pool._connecting

    asyncio.run(scenario())


def test_static_workers_are_never_removed_by_discovery(fake_engines):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        starting = asyncio.create_task(pool.start(["a"], 5))
        await asyncio.sleep(0)
        fake_engines["a"].answer.set()
        await starting
        pool.add("a")
        await pool.remove("a")
        assert pool.connected_engines() and not fake_engines["a"].stopped

    asyncio.run(scenario())


def test_a_worker_with_another_model_is_not_used(fake_engines):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        pool.add("a")
        fake_engines["a"].answer.set()
        pool.add("b")
        fake_engines["b"].model = "other"
        fake_engines["b"].answer.set()
        await asyncio.sleep(0.05)
        assert [engine.address for engine in pool.connected_engines()] == ["a"]
        assert fake_engines["b"].stopped

    asyncio.run(scenario())


def test_health_follows_connects_and_disconnects(fake_engines):
    async def status(servicer, service=""):
        request = health_pb2.HealthCheckRequest(service=service)
        return (await servicer.Check(request, None)).status

    async def eventually(servicer, expected):
        for _ in range(100):
            if await status(servicer) == expected and await status(servicer, "svc") == expected:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"status never became {expected}")

    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        servicer = health.aio.HealthServicer()
        following = asyncio.create_task(follow_workers(pool, servicer, ["svc"]))
        await eventually(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        pool.add("a")
        fake_engines["a"].answer.set()
        await eventually(servicer, health_pb2.HealthCheckResponse.SERVING)
        await pool.remove("a")
        await eventually(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        following.cancel()

    asyncio.run(scenario())


def test_the_engine_reports_cached_prefix_tokens_without_taking_blocks():
    harness = Harness(block_size=4, num_blocks=16)
    prompt = list(range(100, 110))  # two full blocks and a partial one
    harness.add(make_request(prompt, max_tokens=2))
    harness.run()
    engine = WorkerEngine("w", harness.scheduler.config, tokenizer=None)
    engine.scheduler = harness.scheduler
    assert engine.cached_prefix_tokens(prompt) == 0  # not connected: never picked for a hit
    engine._set_connected(True)
    free_before = harness.block_manager.num_free_blocks
    assert engine.cached_prefix_tokens(prompt) == 8
    assert engine.cached_prefix_tokens(prompt[:8]) == 4  # the last token is always computed
    assert engine.cached_prefix_tokens([7, *prompt[1:]]) == 0
    assert harness.block_manager.num_free_blocks == free_before


def test_removed_workers_keep_counters_and_lose_their_series(fake_engines):
    async def scenario():
        metrics = SchedulerMetrics(model_name="m")
        pool = WorkerPool(SchedulerConfig(), tokenizer=None, metrics=metrics)
        metrics.watch(pool)
        pool.add("a")
        fake_engines["a"].answer.set()
        await asyncio.sleep(0.01)
        metrics.observe_iteration("a", step_s=0.01, forward_s=0.008, total_s=0.012)
        before = parse_samples(generate_latest(metrics.registry).decode())
        await pool.remove("a")
        return before, parse_samples(generate_latest(metrics.registry).decode())

    before, after = asyncio.run(scenario())
    assert before['cbserve_step_overhead_seconds_count{worker="a"}'] == 1
    assert any('worker="a"' in key for key in before)
    assert not any('worker="a"' in key for key in after)
    assert after["cbserve_num_preemptions_total"] == 2


@pytest.fixture
def quick_retries(monkeypatch):
    """Static start-up attempts and their backoff in milliseconds, not seconds."""
    from scheduler_svc.workers import liveness

    monkeypatch.setattr(worker_pool, "STATIC_ATTEMPT_S", 0.05)
    monkeypatch.setattr(liveness, "RETRY_DELAYS_S", (0.01, 0.02, 0.05))


def test_static_start_serves_once_one_worker_answers_and_retries_the_late_one(
    fake_engines, quick_retries
):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        starting = asyncio.create_task(pool.start(["a", "b"], 5))
        await asyncio.sleep(0.01)
        assert not starting.done()  # nobody answers yet: not serving
        fake_engines["a"].answer.set()
        await asyncio.wait_for(starting, 1)  # b failed an attempt: serve without it
        assert [engine.address for engine in pool.connected_engines()] == ["a"]
        fake_engines["b"].answer.set()  # b finished loading: the retries find it
        for _ in range(100):
            if len(pool.connected_engines()) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(engine.address for engine in pool.connected_engines()) == ["a", "b"]
        await pool.stop()

    asyncio.run(scenario())


def test_static_start_waits_for_every_worker_that_answers_at_once(fake_engines, quick_retries):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        starting = asyncio.create_task(pool.start(["a", "b"], 5))
        await asyncio.sleep(0)
        fake_engines["a"].answer.set()
        fake_engines["b"].answer.set()
        await asyncio.wait_for(starting, 1)
        assert len(pool.connected_engines()) == 2

    asyncio.run(scenario())


def test_static_start_fails_naming_every_worker_when_none_answers(fake_engines, quick_retries):
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        with pytest.raises(worker_pool.NoWorkerReady) as raised:
            await pool.start(["a", "b"], 0.3)
        message = str(raised.value)
        assert "no worker ready after 0.3s" in message
        assert "a: a unreachable" in message and "b: b unreachable" in message
        await pool.stop()

    asyncio.run(scenario())
