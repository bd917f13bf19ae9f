"""What the scheduler's and the worker's registries expose beyond their counters:
`model_name` on every cbserve_* series, the KV-cache usage ratio read from the
pool at scrape time, and the process metrics.

The pool here is a plain object with the attributes scheduler_svc.pool_metrics'
PoolView names; the real pool and engines are scraped in
tests/integration/test_ops_metrics.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cbserve.worker.v1 import worker_pb2
from common.metrics import parse_samples
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.metrics import SchedulerMetrics
from worker_svc.metrics import WorkerMetrics


@dataclass
class _Engine:
    connected: bool
    num_kv_blocks: int
    num_used_blocks: int
    num_running: int = 0
    num_waiting: int = 0
    num_cached_blocks: int = 0
    num_submitted: int = 0
    stats: SchedulerStats = field(default_factory=SchedulerStats)


@dataclass
class _Pool:
    engines: dict[str, _Engine]
    retired_stats: SchedulerStats = field(default_factory=SchedulerStats)

    def connected_engines(self) -> list[_Engine]:
        return [engine for engine in self.engines.values() if engine.connected]


def _watching(pool: _Pool) -> SchedulerMetrics:
    metrics = SchedulerMetrics(model_name="SmolLM2-135M-Instruct")
    metrics.watch(pool)
    return metrics


def _samples(metrics) -> dict[str, float]:
    return parse_samples(generate_latest(metrics.registry).decode())


def test_kv_cache_usage_ratio_is_used_over_total_blocks_of_the_connected_workers():
    pool = _Pool(
        {
            "a:1": _Engine(connected=True, num_kv_blocks=100, num_used_blocks=25),
            "b:1": _Engine(connected=True, num_kv_blocks=50, num_used_blocks=50),
            # Reconnecting: its blocks are not in the total, nor its ratio above 0.
            "c:1": _Engine(connected=False, num_kv_blocks=64, num_used_blocks=8),
        }
    )
    samples = _samples(_watching(pool))
    assert samples["cbserve_kv_blocks_total"] == 150
    assert samples["cbserve_kv_cache_usage_ratio"] == pytest.approx(75 / 150)
    ratios = {
        worker: samples[f'cbserve_worker_kv_cache_usage_ratio{{worker="{worker}"}}']
        for worker in pool.engines
    }
    assert ratios == {"a:1": 0.25, "b:1": 1.0, "c:1": 0.0}
    # Read at scrape time: the next scrape sees blocks freed since.
    pool.engines["b:1"].num_used_blocks = 0
    assert _samples(_watching(pool))["cbserve_kv_cache_usage_ratio"] == pytest.approx(25 / 150)


def test_kv_cache_usage_ratio_is_zero_without_a_worker():
    samples = _samples(_watching(_Pool({})))
    assert samples["cbserve_kv_cache_usage_ratio"] == 0
    assert not any(key.startswith("cbserve_worker_kv_cache_usage_ratio") for key in samples)


def _cbserve_samples(metrics):
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("cbserve_"):
                yield sample


def test_every_scheduler_series_carries_the_model_name():
    pool = _Pool({"a:1": _Engine(connected=True, num_kv_blocks=10, num_used_blocks=1)})
    metrics = _watching(pool)
    metrics.observe_iteration("a:1", step_s=0.01, forward_s=0.008, total_s=0.012)
    metrics.count_finished("stop")
    metrics.count_failed("INVALID_ARGUMENT")
    samples = list(_cbserve_samples(metrics))
    names = {sample.name for sample in samples}
    # Observed, scrape-time and per-worker series alike.
    for name in (
        "cbserve_time_to_first_token_seconds_count",
        "cbserve_requests_failed_total",
        "cbserve_step_forward_seconds_count",
        "cbserve_num_preemptions_total",
        "cbserve_kv_cache_usage_ratio",
        "cbserve_worker_connected",
    ):
        assert name in names
    assert {sample.labels.get("model_name") for sample in samples} == {"SmolLM2-135M-Instruct"}


def test_the_worker_series_carry_the_model_name():
    metrics = WorkerMetrics(model_name="SmolLM2-135M-Instruct")
    metrics.observe_step(worker_pb2.StepResult(forward_seconds=0.02, num_tokens=7))
    metrics.steps_failed.inc()
    samples = list(_cbserve_samples(metrics))
    assert {sample.name for sample in samples} >= {
        "cbserve_worker_forward_seconds_count",
        "cbserve_worker_batch_tokens_sum",
        "cbserve_worker_steps_failed_total",
    }
    assert {sample.labels.get("model_name") for sample in samples} == {"SmolLM2-135M-Instruct"}
    flat = parse_samples(generate_latest(metrics.registry).decode())
    assert flat["cbserve_worker_batch_tokens_sum"] == 7
    assert flat["cbserve_worker_steps_failed_total"] == 1


@pytest.mark.parametrize("build", [lambda: _watching(_Pool({})), lambda: WorkerMetrics("m")])
def test_both_processes_expose_their_process_metrics(build):
    samples = _samples(build())
    assert samples["process_resident_memory_bytes"] > 0
    assert samples["process_cpu_seconds_total"] >= 0
    assert "process_start_time_seconds" in samples
    assert any(key.startswith("python_info{") for key in samples)
