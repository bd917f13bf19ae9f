"""The worker's own Prometheus metrics, at its --metrics-port.

The scheduler already measures each step from its side (plan sent to result
received, cbserve_step_duration_seconds); the worker adds what only it sees:
how long the model forward took (cbserve_worker_forward_seconds, the same
number it returns in StepResult.forward_seconds) and how many tokens the flat
batch held. The difference between the two step times is the gRPC round trip
plus packing, which is what to look at when the scheduler's steps are slow
but the forwards are not.

Observed on the event loop, after the forward thread has returned the result,
so the registry is never touched from two threads. Every cbserve_worker_*
series carries `model_name` (the name Describe reports: its --model path's
last part); the registry also holds the process's own metrics
(process_resident_memory_bytes and the like).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from cbserve.worker.v1 import worker_pb2
from common.metrics import LATENCY_BUCKETS, MODEL_NAME_LABEL, TOKEN_BUCKETS, new_registry


class WorkerMetrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = registry = new_registry()
        labels = (MODEL_NAME_LABEL,)
        # Bound to the model now, so that each series shows 0 before the first step.
        self.forward_seconds = Histogram(
            "cbserve_worker_forward_seconds",
            "One step's forward pass and sampling on the worker (StepResult.forward_seconds).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.batch_tokens = Histogram(
            "cbserve_worker_batch_tokens",
            "Tokens computed in one step's flat batch (prefill chunks plus decodes).",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.steps_failed = Counter(
            "cbserve_worker_steps_failed_total",
            "Steps that ended the Step stream with an error (rejected plan or failed forward).",
            labels,
            registry=registry,
        ).labels(model_name)

    def watch_experts(self, model) -> None:
        """Router statistics of a mixture-of-experts model (worker_svc/router_stats.py),
        read at each scrape; nothing for a dense model."""
        from worker_svc.router_stats import RouterStatsCollector, expert_layers

        layers = expert_layers(model)
        if layers:
            self.registry.register(RouterStatsCollector(self.model_name, layers))

    def observe_step(self, result: worker_pb2.StepResult) -> None:
        self.forward_seconds.observe(result.forward_seconds)
        self.batch_tokens.observe(result.num_tokens)
