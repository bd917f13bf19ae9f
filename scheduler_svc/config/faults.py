"""How long the scheduler waits for what may never come: a worker to connect, a worker
to answer (keepalive and step deadlines, scheduler_svc/workers/), in-flight requests
at shutdown, and how many calls may wait at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.flag_fields import flag
from scheduler_svc.config.process import ENV_PREFIX

# Keepalive pings every half of it must stay at or above 1 s (common.grpc_options).
MIN_WORKER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class FaultConfig:
    """How long the scheduler waits for things that may never come."""

    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    # New requests get UNAVAILABLE at once once no worker has been seen for this long.
    worker_wait_timeout_s: float = flag(
        30.0,
        name="worker-wait-timeout",
        metavar="SECONDS",
        help="seconds accepted requests wait for a worker when none is connected, before "
        "UNAVAILABLE (sooner at their own deadline)",
    )
    worker_timeout_s: float = flag(
        10.0,
        name="worker-timeout",
        metavar="SECONDS",
        help="a worker that answers no keepalive ping for this many seconds (dead, stopped, "
        "unreachable) is lost, idle or mid-step, and its requests are recomputed on others; "
        "also a one-token step's deadline (at least 2)",
    )
    step_seconds_per_token: float = flag(
        0.05,
        help="what a step's deadline grows by for each token it computes, so that a long "
        "prefill is not taken for a hang",
    )
    grace_period_s: float = flag(
        30.0,
        name="grace-period",
        metavar="SECONDS",
        help="on SIGTERM, seconds in-flight requests get to finish",
    )
    max_concurrent_streams: int = flag(
        1024, help="Generate calls in flight at once before RESOURCE_EXHAUSTED"
    )

    def __post_init__(self) -> None:
        for name in ("worker_wait_timeout_s", "worker_timeout_s", "grace_period_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if self.worker_timeout_s < MIN_WORKER_TIMEOUT_S:
            # Keepalive pings go out every worker_timeout_s / 2; workers refuse
            # pings more often than every half second (common.grpc_options).
            minimum, value = MIN_WORKER_TIMEOUT_S, self.worker_timeout_s
            raise ValueError(f"worker_timeout_s must be >= {minimum:g}, got {value!r}")
        per_token = self.step_seconds_per_token
        if isinstance(per_token, bool) or not isinstance(per_token, int | float) or per_token < 0:
            raise ValueError(f"step_seconds_per_token must be a number >= 0, got {per_token!r}")
        streams = self.max_concurrent_streams
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(f"max_concurrent_streams must be an integer >= 1, got {streams!r}")

    @property
    def deferred_mask_timeout_s(self) -> float:
        """How long a worker's sampler waits for a deferred mask before it fails that
        request: half a one-token step's deadline, so that the wait and the forward
        fit in it and the request fails, not the worker."""
        return self.worker_timeout_s / 2

    def step_deadline_s(self, num_tokens: int) -> float:
        """Seconds a step computing num_tokens may take before its worker counts as hung."""
        return self.worker_timeout_s + num_tokens * self.step_seconds_per_token
