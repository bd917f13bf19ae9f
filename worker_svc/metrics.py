"""The worker's own Prometheus metrics, at its --metrics-port.

The scheduler already measures each step from its side (plan sent to result
received, cbserve_step_duration_seconds); the worker adds what only it sees:
how long the model forward took (cbserve_worker_forward_seconds, the same
number it returns in StepResult.forward_seconds) and how many tokens the flat
batch held. The difference between the two step times is the gRPC round trip
plus packing, which is what to look at when the scheduler's steps are slow
but the forwards are not.

Observed on the event loop, after the forward thread has returned the result,
so the registry is never touched from two threads.
"""

from __future__ import annotations

from cbserve.worker.v1 import worker_pb2
from common.metrics import LATENCY_BUCKETS, TOKEN_BUCKETS, Registry


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = Registry()
        self.forward_seconds = self.registry.histogram(
            "cbserve_worker_forward_seconds",
            "One step's forward pass and sampling on the worker (StepResult.forward_seconds).",
            LATENCY_BUCKETS,
        )
        self.batch_tokens = self.registry.histogram(
            "cbserve_worker_batch_tokens",
            "Tokens computed in one step's flat batch (prefill chunks plus decodes).",
            TOKEN_BUCKETS,
        )
        self.steps_failed = self.registry.counter(
            "cbserve_worker_steps_failed_total",
            "Steps that ended the Step stream with an error (rejected plan or failed forward).",
        )

    def observe_step(self, result: worker_pb2.StepResult) -> None:
        self.forward_seconds.observe(result.forward_seconds)
        self.batch_tokens.observe(result.num_tokens)
