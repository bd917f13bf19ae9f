"""The scheduler's Prometheus metrics.

Two sources. Request histograms and the finished/failed counters are observed
as things happen (RequestTrace at the end of each Generate call, the engines
for step durations). Queue lengths, block counts and per-worker gauges are
read from the engines at scrape time, so they cost nothing per step; the
totals sum the live engines and the pool's retired_stats (the counters of
removed workers), so that a counter never goes backwards when a worker leaves.
Per-worker series carry the worker's address as the `worker` label and vanish
with the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from common.metrics import TOKEN_BUCKETS, Registry, Samples
from scheduler_svc.workers.liveness import LossCause

if TYPE_CHECKING:
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.pool import WorkerPool

# Between two tokens of one stream: a decode step, from a fast GPU to a busy CPU.
INTER_TOKEN_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = registry = Registry()
        self.time_to_first_token = registry.histogram(
            "cbserve_time_to_first_token_seconds",
            "From the Generate call to its first token sent to the client.",
        )
        self.inter_token_latency = registry.histogram(
            "cbserve_inter_token_latency_seconds",
            "Between consecutive tokens of one stream.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e_request_latency = registry.histogram(
            "cbserve_e2e_request_latency_seconds",
            "From the Generate call to its last token, for requests that finished.",
        )
        self.request_queue_time = registry.histogram(
            "cbserve_request_queue_time_seconds",
            "From placement on a worker to the first step that computes the request.",
        )
        self.request_prompt_tokens = registry.histogram(
            "cbserve_request_prompt_tokens", "Prompt tokens of finished requests.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = registry.histogram(
            "cbserve_request_generation_tokens",
            "Generated tokens of finished requests.",
            TOKEN_BUCKETS,
        )
        self.step_duration = registry.histogram(
            "cbserve_step_duration_seconds",
            "One model step as the scheduler sees it: plan sent to result received.",
            labelnames=("worker",),
        )
        # Forward and overhead split one engine iteration (schedule, step, postprocess)
        # in two; their sums give the share of a step the model does not use.
        self.step_forward = registry.histogram(
            "cbserve_step_forward_seconds",
            "One step's time inside the worker's model runner (validate, forward, sample), "
            "as the worker reports it.",
            labelnames=("worker",),
        )
        self.step_overhead = registry.histogram(
            "cbserve_step_overhead_seconds",
            "One engine iteration's time outside the worker's model runner: scheduling, "
            "protobuf, network, detokenizing and streaming to clients.",
            labelnames=("worker",),
        )
        self.requests_finished = registry.counter(
            "cbserve_requests_finished_total",
            "Requests that ended normally: stop (EOS, stop token or string), length "
            "(max_tokens, model length), abort (cancelled or disconnected client).",
            labelnames=("reason",),
        )
        self.requests_failed = registry.counter(
            "cbserve_requests_failed_total",
            "Generate calls that ended with an error status, by gRPC status code.",
            labelnames=("code",),
        )
        self.workers_lost = registry.counter(
            "cbserve_worker_lost_total",
            "Workers declared lost, by cause: disconnected (stream or connection ended), "
            "keepalive (a ping unanswered: stopped or unreachable), step_timeout (no result "
            "within the step's deadline), protocol (an answer out of protocol or an error).",
            labelnames=("cause",),
        )
        self.requests_recomputed = registry.counter(
            "cbserve_requests_recomputed_total",
            "Unfinished requests of lost workers, moved to be recomputed on another worker.",
        )
        # Known label values start at 0, so that rate() sees the first one.
        for reason in FINISH_REASONS:
            self.requests_finished.inc(0, reason=reason)
        for cause in LossCause:
            self.workers_lost.inc(0, cause=cause.value)
        self.requests_recomputed.inc(0)

    def forget_worker(self, address: str) -> None:
        """A worker left the pool: its own series go (the scrape-time ones go by themselves)."""
        for histogram in (self.step_duration, self.step_forward, self.step_overhead):
            histogram.remove(worker=address)

    def observe_worker_lost(self, cause: str, num_requests: int) -> None:
        """A worker was lost with num_requests unfinished on it (they move elsewhere)."""
        self.workers_lost.inc(cause=cause)
        self.requests_recomputed.inc(num_requests)

    def observe_iteration(self, address: str, step_s: float, forward_s: float, total_s: float):
        """One engine iteration: the RPC's time, the worker's forward time, the whole."""
        self.step_duration.observe(step_s, worker=address)
        self.step_forward.observe(forward_s, worker=address)
        self.step_overhead.observe(max(0.0, total_s - forward_s), worker=address)

    def watch(self, pool: WorkerPool) -> None:
        """Adds the gauges and counters read from the pool's engines at scrape time."""
        registry = self.registry

        def total(value: Callable[[WorkerEngine], float]) -> Callable[[], Samples]:
            return lambda: [({}, float(sum(value(engine) for engine in pool.engines.values())))]

        def counter_total(name: str, help_text: str, stat: str) -> None:
            def samples() -> Samples:
                live = sum(getattr(engine.stats, stat) for engine in pool.engines.values())
                return [({}, float(getattr(pool.retired_stats, stat) + live))]

            registry.counter(name, help_text).set_callback(samples)

        def per_worker(value: Callable[[WorkerEngine], float]) -> Callable[[], Samples]:
            return lambda: [
                ({"worker": address}, float(value(engine)))
                for address, engine in sorted(pool.engines.items())
            ]

        registry.gauge(
            "cbserve_num_requests_running",
            "Requests admitted to a worker's batch (prefilling or decoding).",
        ).set_callback(total(lambda engine: engine.num_running))
        registry.gauge(
            "cbserve_num_requests_waiting",
            "Requests queued for admission, including preempted ones.",
        ).set_callback(total(lambda engine: engine.num_waiting))
        registry.gauge(
            "cbserve_kv_blocks_total", "KV cache blocks in the connected workers' pools."
        ).set_callback(total(lambda engine: engine.num_kv_blocks if engine.connected else 0))
        registry.gauge(
            "cbserve_kv_blocks_used",
            "KV blocks held by live requests; free blocks kept for the prefix cache do not count.",
        ).set_callback(total(lambda engine: engine.num_used_blocks))
        registry.gauge(
            "cbserve_kv_blocks_cached", "Free KV blocks that still hold a reusable prefix."
        ).set_callback(total(lambda engine: engine.num_cached_blocks))
        counter_total(
            "cbserve_num_preemptions_total",
            "Running requests preempted (their KV freed, recomputed later) for lack of blocks.",
            "num_preemptions",
        )
        counter_total(
            "cbserve_prefix_cache_queries_total",
            "Tokens looked up in the prefix cache when requests were admitted.",
            "prefix_cache_queries",
        )
        counter_total(
            "cbserve_prefix_cache_hits_total",
            "Tokens whose KV was found in the prefix cache at admission.",
            "prefix_cache_hits",
        )
        registry.gauge(
            "cbserve_workers_connected", "Workers with an open Step stream."
        ).set_callback(lambda: [({}, float(len(pool.connected_engines())))])

        def worker_gauge(name: str, help_text: str, value: Callable[[WorkerEngine], float]):
            registry.gauge(name, help_text, ("worker",)).set_callback(per_worker(value))

        worker_gauge(
            "cbserve_worker_connected",
            "1 while the worker's Step stream is open, 0 while it is (re)connecting.",
            lambda engine: 1 if engine.connected else 0,
        )
        worker_gauge(
            "cbserve_worker_num_requests_running",
            "Requests in the worker's batch.",
            lambda engine: engine.num_running,
        )
        worker_gauge(
            "cbserve_worker_num_requests_waiting",
            "Requests queued for the worker.",
            lambda engine: engine.num_waiting,
        )
        worker_gauge(
            "cbserve_worker_kv_blocks_used",
            "KV blocks of the worker held by live requests.",
            lambda engine: engine.num_used_blocks,
        )
        worker_gauge(
            "cbserve_worker_kv_blocks_total",
            "KV blocks in the worker's pool.",
            lambda engine: engine.num_kv_blocks if engine.connected else 0,
        )
        registry.counter(
            "cbserve_worker_requests_total",
            "Requests placed on the worker since it joined the pool.",
            ("worker",),
        ).set_callback(per_worker(lambda engine: engine.num_submitted))
