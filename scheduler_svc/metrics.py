"""The scheduler's Prometheus metrics, read from the engines at scrape time.

Queue lengths and block counts are the schedulers' own numbers, summed over
the connected workers; counters come from each engine's SchedulerStats, which
outlive reconnects, so they never go backwards.
"""

from __future__ import annotations

from collections.abc import Callable

from common.metrics import Registry, Samples
from scheduler_svc.worker_pool import WorkerPool


def _sum_over_engines(pool: WorkerPool, value: Callable) -> Callable[[], Samples]:
    return lambda: [({}, float(sum(value(engine) for engine in pool.engines)))]


def build_scheduler_metrics(pool: WorkerPool) -> Registry:
    registry = Registry()

    def gauge(name: str, help_text: str, value: Callable) -> None:
        registry.gauge(name, help_text).set_callback(_sum_over_engines(pool, value))

    def counter(name: str, help_text: str, value: Callable) -> None:
        registry.counter(name, help_text).set_callback(_sum_over_engines(pool, value))

    gauge(
        "cbserve_num_requests_running",
        "Requests admitted to a worker's batch (prefilling or decoding).",
        lambda engine: engine.num_running,
    )
    gauge(
        "cbserve_num_requests_waiting",
        "Requests queued for admission, including preempted ones.",
        lambda engine: engine.num_waiting,
    )
    gauge(
        "cbserve_kv_blocks_total",
        "KV cache blocks in the connected workers' pools.",
        lambda engine: engine.num_kv_blocks if engine.connected else 0,
    )
    gauge(
        "cbserve_kv_blocks_used",
        "KV blocks held by live requests; free blocks kept for the prefix cache do not count.",
        lambda engine: engine.num_used_blocks,
    )
    gauge(
        "cbserve_kv_blocks_cached",
        "Free KV blocks that still hold a reusable prefix.",
        lambda engine: engine.num_cached_blocks,
    )
    counter(
        "cbserve_num_preemptions_total",
        "Running requests preempted (their KV freed, recomputed later) for lack of blocks.",
        lambda engine: engine.stats.num_preemptions,
    )
    counter(
        "cbserve_prefix_cache_queries_total",
        "Tokens looked up in the prefix cache when requests were admitted.",
        lambda engine: engine.stats.prefix_cache_queries,
    )
    counter(
        "cbserve_prefix_cache_hits_total",
        "Tokens whose KV was found in the prefix cache at admission.",
        lambda engine: engine.stats.prefix_cache_hits,
    )
    return registry
