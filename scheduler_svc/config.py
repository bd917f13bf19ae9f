"""Scheduler limits and policies, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

BATCHING_MODES = ("continuous", "static")
# Keepalive pings every half of it must stay at or above 1 s (common.grpc_options).
MIN_WORKER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SchedulerConfig:
    # Most sequences admitted (running) at once, hence most sequences in one step
    # (see max_running_seqs).
    max_num_seqs: int = 128
    # Token budget of one step: decodes take one token each, prefills take what is
    # left, split over several steps when a prompt is longer (chunked prefill).
    max_num_batched_tokens: int = 512
    # Requests queued (not yet running) across all workers; past it Generate
    # answers RESOURCE_EXHAUSTED at once instead of growing an unbounded queue.
    max_waiting_requests: int = 1024
    # Share full KV blocks between requests with equal prefixes.
    enable_prefix_caching: bool = True
    # How often requests behind a waiting request may be admitted while it does
    # not fit, before the queue stops at it until it does (no starvation).
    max_bypasses: int = 16
    # Fraction of the pool kept free when admitting beside running requests, so
    # that their decodes do not need a preemption at every block boundary.
    watermark: float = 0.01
    # "continuous": requests join and leave at every step. "static": a batch is
    # admitted only when the previous one has completely finished (the
    # pre-continuous-batching baseline the benchmark compares against).
    batching: str = "continuous"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_bypasses, bool) or not isinstance(self.max_bypasses, int):
            raise ValueError(f"max_bypasses must be an integer, got {self.max_bypasses!r}")
        if self.max_bypasses < 0:
            raise ValueError(f"max_bypasses must be >= 0, got {self.max_bypasses}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")

    @property
    def max_running_seqs(self) -> int:
        """The cap on running sequences that the scheduler applies.

        A step must be able to give every running sequence its decode token, or
        the sequences at the back of the running queue would starve; so a budget
        smaller than max_num_seqs (handy to force chunking in tests) also caps
        the sequences. vLLM refuses such a config instead.
        """
        return min(self.max_num_seqs, self.max_num_batched_tokens)


@dataclass(frozen=True)
class FaultConfig:
    """How long the scheduler waits for things that may never come."""

    # With no worker connected, accepted requests wait this long for one to come
    # back before they end with UNAVAILABLE (sooner at their own deadline); new
    # requests get UNAVAILABLE at once once no worker has been seen for this long.
    worker_wait_timeout_s: float = 30.0
    # A worker that answers no keepalive ping for this long (dead, stopped,
    # unreachable) is lost, idle or not; it is also the deadline of a one-token step.
    worker_timeout_s: float = 10.0
    # What a step's deadline grows by per token it computes, so that a long
    # prefill is not taken for a hung forward pass (seconds per token).
    step_seconds_per_token: float = 0.05
    # On SIGTERM: in-flight requests get this long to finish before the exit.
    grace_period_s: float = 30.0
    # Generate calls in flight at once; past it, RESOURCE_EXHAUSTED.
    max_concurrent_streams: int = 1024

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

    def step_deadline_s(self, num_tokens: int) -> float:
        """Seconds a step computing num_tokens may take before its worker counts as hung."""
        return self.worker_timeout_s + num_tokens * self.step_seconds_per_token
