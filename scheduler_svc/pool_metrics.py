"""The scheduler's series read from the worker pool at scrape time.

Queue lengths, block counts, the KV-cache usage ratio and the per-worker gauges
are read from the engines when Prometheus scrapes, so they cost nothing per
step. The counter totals sum the live engines and the pool's retired_stats (the
counters of removed workers), so that a counter never goes backwards when a
worker leaves. Per-worker series carry the worker's address as the `worker`
label and vanish with the worker.

What is read from the pool and its engines is described by the Protocol classes
below, not imported: the engine and the pool import the metrics, and the
metrics need none of their code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics import MODEL_NAME_LABEL
from scheduler_svc.core.speculation_stats import DraftStats

PER_WORKER = (MODEL_NAME_LABEL, "worker")


class StatsView(Protocol):
    """The counters an engine's scheduler keeps (scheduler_svc.core.stats.SchedulerStats)."""

    @property
    def num_preemptions(self) -> int: ...
    @property
    def prefix_cache_queries(self) -> int: ...
    @property
    def prefix_cache_hits(self) -> int: ...
    @property
    def drafts(self) -> DraftStats: ...


class EngineView(Protocol):
    """One worker's engine, as the metrics read it."""

    @property
    def connected(self) -> bool: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_kv_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int: ...
    @property
    def num_submitted(self) -> int: ...
    @property
    def stats(self) -> StatsView: ...


class PoolView(Protocol):
    """The worker pool: its engines by address and the counters of removed ones."""

    @property
    def engines(self) -> Mapping[str, EngineView]: ...
    @property
    def retired_stats(self) -> StatsView: ...
    def connected_engines(self) -> Sequence[EngineView]: ...


def _usage_ratio(used: int, total: int) -> float:
    return used / total if total > 0 else 0.0


def _blocks(engine: EngineView) -> int:
    return engine.num_kv_blocks if engine.connected else 0


# Summed over the live engines plus the pool's retired_stats: name, help, SchedulerStats field.
_COUNTER_TOTALS = (
    (
        "cbserve_num_preemptions_total",
        "Running requests preempted (their KV freed, recomputed later) for lack of blocks.",
        "num_preemptions",
    ),
    (
        "cbserve_prefix_cache_queries_total",
        "Tokens looked up in the prefix cache when requests were admitted.",
        "prefix_cache_queries",
    ),
    (
        "cbserve_prefix_cache_hits_total",
        "Tokens whose KV was found in the prefix cache at admission.",
        "prefix_cache_hits",
    ),
)
# Speculative decoding, as vLLM's spec_decode_* counters: name, help, DraftStats field.
_DRAFT_TOTALS = (
    (
        "cbserve_spec_decode_num_drafts",
        "Drafts verified: decodes that checked at least one draft token of their own.",
        "num_drafts",
    ),
    (
        "cbserve_spec_decode_num_draft_tokens",
        "Draft tokens verified.",
        "num_draft_tokens",
    ),
    (
        "cbserve_spec_decode_num_accepted_tokens",
        "Draft tokens accepted (emitted as the target model's own).",
        "num_accepted_tokens",
    ),
)
# One sample per worker, labelled with its address: family, name, help, value.
_PER_WORKER_SERIES = (
    (
        GaugeMetricFamily,
        "cbserve_worker_connected",
        "1 while the worker's Step stream is open, 0 while it is (re)connecting.",
        lambda engine: 1 if engine.connected else 0,
    ),
    (
        GaugeMetricFamily,
        "cbserve_worker_num_requests_running",
        "Requests in the worker's batch.",
        lambda engine: engine.num_running,
    ),
    (
        GaugeMetricFamily,
        "cbserve_worker_num_requests_waiting",
        "Requests queued for the worker.",
        lambda engine: engine.num_waiting,
    ),
    (
        GaugeMetricFamily,
        "cbserve_worker_kv_blocks_used",
        "KV blocks of the worker held by live requests.",
        lambda engine: engine.num_used_blocks,
    ),
    (
        GaugeMetricFamily,
        "cbserve_worker_kv_blocks_total",
        "KV blocks in the worker's pool.",
        _blocks,
    ),
    (
        GaugeMetricFamily,
        "cbserve_worker_kv_cache_usage_ratio",
        "The worker's KV blocks held by live requests over its KV blocks (0 to 1; 0 while "
        "it is not connected).",
        lambda engine: _usage_ratio(engine.num_used_blocks, _blocks(engine)),
    ),
    (
        CounterMetricFamily,
        "cbserve_worker_requests_total",
        "Requests placed on the worker since it joined the pool.",
        lambda engine: engine.num_submitted,
    ),
)


class PoolCollector(Collector):
    """The series a scrape reads from the pool's engines, at that moment."""

    def __init__(self, pool: PoolView, model_name: str) -> None:
        self.pool = pool
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        pool = self.pool
        engines = sorted(pool.engines.items())
        live = [engine for _, engine in engines]
        connected = [engine for engine in live if engine.connected]
        total_blocks = sum(engine.num_kv_blocks for engine in connected)
        gauges = (
            (
                "cbserve_num_requests_running",
                "Requests admitted to a worker's batch (prefilling or decoding).",
                sum(engine.num_running for engine in live),
            ),
            (
                "cbserve_num_requests_waiting",
                "Requests queued for admission, including preempted ones.",
                sum(engine.num_waiting for engine in live),
            ),
            (
                "cbserve_kv_blocks_total",
                "KV cache blocks in the connected workers' pools.",
                total_blocks,
            ),
            (
                "cbserve_kv_blocks_used",
                "KV blocks held by live requests; free blocks kept for the prefix cache do not "
                "count.",
                sum(engine.num_used_blocks for engine in live),
            ),
            (
                "cbserve_kv_blocks_cached",
                "Free KV blocks that still hold a reusable prefix.",
                sum(engine.num_cached_blocks for engine in live),
            ),
            (
                "cbserve_kv_cache_usage_ratio",
                "KV blocks held by live requests over all KV blocks, in the connected workers "
                "(0 to 1; 0 with no worker).",
                _usage_ratio(sum(engine.num_used_blocks for engine in connected), total_blocks),
            ),
            (
                "cbserve_workers_connected",
                "Workers with an open Step stream.",
                len(pool.connected_engines()),
            ),
        )
        for name, help_text, value in gauges:
            gauge = GaugeMetricFamily(name, help_text, labels=[MODEL_NAME_LABEL])
            gauge.add_metric([self.model_name], value)
            yield gauge
        for name, help_text, stat in _COUNTER_TOTALS:
            counter = CounterMetricFamily(name, help_text, labels=[MODEL_NAME_LABEL])
            summed = sum(getattr(engine.stats, stat) for engine in live)
            counter.add_metric([self.model_name], getattr(pool.retired_stats, stat) + summed)
            yield counter
        yield from self._draft_counters(live)
        for family, name, help_text, value in _PER_WORKER_SERIES:
            metric = family(name, help_text, labels=list(PER_WORKER))
            for address, engine in engines:
                metric.add_metric([self.model_name, address], float(value(engine)))
            yield metric

    def _draft_counters(self, live: Sequence[EngineView]) -> Iterator[Metric]:
        every = [self.pool.retired_stats.drafts, *(engine.stats.drafts for engine in live)]
        for name, help_text, stat in _DRAFT_TOTALS:
            counter = CounterMetricFamily(name, help_text, labels=[MODEL_NAME_LABEL])
            counter.add_metric([self.model_name], sum(getattr(d, stat) for d in every))
            yield counter
        per_position = CounterMetricFamily(
            "cbserve_spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose token at this position (from 0) was accepted.",
            labels=[MODEL_NAME_LABEL, "position"],
        )
        width = max(len(d.accepted_per_position) for d in every)
        for position in range(width):
            count = sum(
                d.accepted_per_position[position]
                for d in every
                if position < len(d.accepted_per_position)
            )
            per_position.add_metric([self.model_name, str(position)], count)
        yield per_position
