"""The scheduler's Prometheus metrics.

Two sources. Request histograms and the finished/failed counters are observed
as things happen (RequestTrace at the end of each Generate call, the engines
for step durations). Queue lengths, block counts and per-worker gauges are
read from the pool's engines at scrape time (scheduler_svc.pool_metrics), so
they cost nothing per step.

With --api-processes N the request metrics (RequestTrace's) live in the API
processes, in prometheus-client's multiprocess mode, and the core keeps the engine
and pool ones; the core's registry reads the API processes' files too, so every
/metrics shows the one whole view (split/supervisor.py).

Every cbserve_* series carries `model_name`, as vLLM's do: the name of the
model directory the scheduler's tokenizer is read from. The registry also
holds the process's own metrics (process_resident_memory_bytes and the like).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from common.metrics import LATENCY_BUCKETS, MODEL_NAME_LABEL, TOKEN_BUCKETS, new_registry
from scheduler_svc.kv_metrics import KvTransferMetrics
from scheduler_svc.lora.metrics import LoraCollector
from scheduler_svc.pool_metrics import PoolCollector, PoolView
from scheduler_svc.workers.liveness import LossCause

# Between two tokens of one stream: a decode step, from a fast GPU to a busy CPU.
INTER_TOKEN_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class SchedulerMetrics:
    def __init__(self, model_name: str, *, requests: bool = True, engine: bool = True) -> None:
        """requests: the per-request series (the edge's); engine: the step, worker and
        pool series (the core's). One process that is both has both."""
        self.model_name = model_name
        self.registry = registry = new_registry()

        def histogram(name: str, help_text: str, buckets=LATENCY_BUCKETS, labels=()):
            labelnames = (MODEL_NAME_LABEL, *labels)
            return Histogram(name, help_text, labelnames, buckets=buckets, registry=registry)

        def request_histogram(name: str, help_text: str, buckets=LATENCY_BUCKETS):
            # Bound to the model now, so that the series shows 0 before the first request.
            return histogram(name, help_text, buckets).labels(model_name)

        if requests:
            self._add_request_metrics(histogram, request_histogram)
        if engine:
            self._add_engine_metrics(histogram)

    def _add_request_metrics(self, histogram, request_histogram) -> None:
        model_name, registry = self.model_name, self.registry
        self.time_to_first_token = request_histogram(
            "cbserve_time_to_first_token_seconds",
            "From the Generate call to its first token sent to the client.",
        )
        self.inter_token_latency = request_histogram(
            "cbserve_inter_token_latency_seconds",
            "Between consecutive tokens of one stream.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e_request_latency = request_histogram(
            "cbserve_e2e_request_latency_seconds",
            "From the Generate call to its last token, for requests that finished.",
        )
        self.request_queue_time = request_histogram(
            "cbserve_request_queue_time_seconds",
            "From placement on a worker to the first step that computes the request.",
        )
        self.request_prompt_tokens = request_histogram(
            "cbserve_request_prompt_tokens", "Prompt tokens of finished requests.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = request_histogram(
            "cbserve_request_generation_tokens",
            "Generated tokens of finished requests.",
            TOKEN_BUCKETS,
        )

        self.requests_finished = Counter(
            "cbserve_requests_finished_total",
            "Requests that ended normally: stop (EOS, stop token or string), length "
            "(max_tokens, model length), abort (cancelled or disconnected client).",
            (MODEL_NAME_LABEL, "reason"),
            registry=registry,
        )
        self.requests_failed = Counter(
            "cbserve_requests_failed_total",
            "Generate calls that ended with an error status, by gRPC status code.",
            (MODEL_NAME_LABEL, "code"),
            registry=registry,
        )
        # Known label values start at 0, so that rate() sees the first one.
        for reason in FINISH_REASONS:
            self.requests_finished.labels(model_name, reason)

    def _add_engine_metrics(self, histogram) -> None:
        model_name, registry = self.model_name, self.registry
        self.step_duration = histogram(
            "cbserve_step_duration_seconds",
            "One model step as the scheduler sees it: plan sent to result received.",
            labels=("worker",),
        )
        # Forward and overhead split one engine iteration (schedule, step, postprocess)
        # in two; their sums give the share of a step the model does not use.
        self.step_forward = histogram(
            "cbserve_step_forward_seconds",
            "One step's time inside the worker's model runner (validate, forward, sample), "
            "as the worker reports it.",
            labels=("worker",),
        )
        self.step_overhead = histogram(
            "cbserve_step_overhead_seconds",
            "One engine iteration's time outside the worker's model runner: scheduling, "
            "protobuf, network, detokenizing and streaming to clients.",
            labels=("worker",),
        )
        self.workers_lost = Counter(
            "cbserve_worker_lost_total",
            "Workers declared lost, by cause: disconnected (stream or connection ended), "
            "keepalive (a ping unanswered: stopped or unreachable), step_timeout (no result "
            "within the step's deadline), protocol (an answer out of protocol or an error).",
            (MODEL_NAME_LABEL, "cause"),
            registry=registry,
        )
        self.requests_recomputed = Counter(
            "cbserve_requests_recomputed_total",
            "Unfinished requests of lost workers, moved to be recomputed on another worker.",
            (MODEL_NAME_LABEL,),
            registry=registry,
        ).labels(model_name)
        self.kv_transfers = KvTransferMetrics(registry, model_name)
        # Known label values start at 0, so that rate() sees the first one.
        for cause in LossCause:
            self.workers_lost.labels(model_name, cause.value)

    def count_finished(self, reason: str) -> None:
        """A request ended normally: stop, length or abort."""
        self.requests_finished.labels(self.model_name, reason).inc()

    def count_failed(self, code: str) -> None:
        """A Generate call ended with the error status named code (a grpc.StatusCode's name)."""
        self.requests_failed.labels(self.model_name, code).inc()

    def forget_worker(self, address: str) -> None:
        """A worker left the pool: its own series go (the scrape-time ones go by themselves)."""
        for histogram in (self.step_duration, self.step_forward, self.step_overhead):
            histogram.remove(self.model_name, address)

    def observe_worker_lost(self, cause: str, num_requests: int) -> None:
        """A worker was lost with num_requests unfinished on it (they move elsewhere)."""
        self.workers_lost.labels(self.model_name, cause).inc()
        self.requests_recomputed.inc(num_requests)

    def observe_iteration(self, address: str, step_s: float, forward_s: float, total_s: float):
        """One engine iteration: the RPC's time, the worker's forward time, the whole."""
        labels = (self.model_name, address)
        self.step_duration.labels(*labels).observe(step_s)
        self.step_forward.labels(*labels).observe(forward_s)
        self.step_overhead.labels(*labels).observe(max(0.0, total_s - forward_s))

    def watch(self, pool: PoolView) -> None:
        """Adds the gauges and counters read from the pool's engines at scrape time."""
        self.registry.register(PoolCollector(pool, self.model_name))
        lora = getattr(getattr(pool, "config", None), "lora", None)
        if lora is not None:
            self.registry.register(LoraCollector(pool, lora.max_loras))
