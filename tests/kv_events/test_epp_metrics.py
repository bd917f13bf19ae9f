"""The gauges the endpoint picker reads, against the real Scheduler's state mid-run: the
pool's collector over engines whose schedulers the fake worker drives."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from common.metrics import parse_samples
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.pool_metrics import PoolCollector
from tests.scheduler.harness import Harness, make_request, unique_prompt


@dataclass
class _Engine:
    """A WorkerEngine as the metrics read it, over a harness's scheduler."""

    harness: Harness
    connected: bool = True
    num_submitted: int = 0

    @property
    def _scheduler(self):
        return self.harness.scheduler

    @property
    def num_running(self) -> int:
        return self._scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self._scheduler.num_waiting

    @property
    def num_kv_blocks(self) -> int:
        return self._scheduler.block_manager.num_blocks

    @property
    def num_used_blocks(self) -> int:
        return self._scheduler.block_manager.num_used_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self._scheduler.block_manager.num_cached_blocks

    @property
    def stats(self):
        return self._scheduler.stats


@dataclass
class _Pool:
    engines: dict
    retired_stats: SchedulerStats

    def connected_engines(self):
        return [engine for engine in self.engines.values() if engine.connected]


def _scrape(pool: _Pool) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(PoolCollector(pool, "m"))
    return parse_samples(generate_latest(registry).decode())


def test_waiting_running_and_kv_use_are_the_schedulers_summed_over_workers():
    # Two workers of different pool sizes, each with more requests than its batch takes.
    small = Harness(num_blocks=24, block_size=4, max_num_seqs=3)
    large = Harness(num_blocks=40, block_size=4, max_num_seqs=4)
    for harness, count in ((small, 7), (large, 9)):
        for _ in range(count):
            harness.add(make_request(unique_prompt(18), max_tokens=30, ignore_eos=True))
        for _ in range(4):
            harness.step()
    pool = _Pool({"a:1": _Engine(small), "b:1": _Engine(large)}, SchedulerStats())
    seen = _scrape(pool)
    schedulers = [small.scheduler, large.scheduler]
    running = sum(s.num_running for s in schedulers)
    waiting = sum(s.num_waiting for s in schedulers)
    used = sum(s.block_manager.num_used_blocks for s in schedulers)
    assert running == 7 and waiting == 9  # each batch full, the rest queued
    assert seen["cbserve_num_requests_running"] == running
    assert seen["cbserve_num_requests_waiting"] == waiting
    assert seen["cbserve_kv_cache_usage_ratio"] == used / 64
    assert 0 < seen["cbserve_kv_cache_usage_ratio"] < 1
    # A disconnected worker's pool leaves the fraction's denominator.
    pool.engines["b:1"].connected = False
    assert _scrape(pool)["cbserve_kv_cache_usage_ratio"] == (
        small.scheduler.block_manager.num_used_blocks / 24
    )
