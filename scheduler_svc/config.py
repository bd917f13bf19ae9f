"""Scheduler limits and policies, validated once at construction.

They are also `python -m scheduler_svc`'s flags (common.cli_config): each `flag(...)`
field of SCHEDULER_CONFIGS is one, with the variable CBSERVE_SCHEDULER_<FLAG>; those
marked `forwarded_by` are `cbserve serve`'s (and `cbserve bench`'s) too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.addresses import parse_target, port_or_off
from common.defaults import DEFAULT_METRICS_PORT, DEFAULT_SCHEDULER_PORT
from common.flag_fields import BENCH, SERVE, flag

ENV_PREFIX = "CBSERVE_SCHEDULER_"
# More API processes than cores only costs memory; 64 is far past any one host's need.
MAX_API_PROCESSES = 64
BATCHING_MODES = ("continuous", "static")
# Keepalive pings every half of it must stay at or above 1 s (common.grpc_options).
MIN_WORKER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SchedulerConfig:
    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    # Most sequences admitted (running) at once, hence most sequences in one step
    # (see max_running_seqs).
    max_num_seqs: int = flag(128, forwarded_by=(SERVE, BENCH), help="most sequences in one step")
    # Chunked prefill: a prompt longer than what is left of the budget is split
    # over several steps, after the decodes (one token each) have taken theirs.
    max_num_batched_tokens: int = flag(
        512,
        forwarded_by=(SERVE, BENCH),
        help="token budget of one step; longer prompts are prefilled in chunks",
    )
    # Past it Generate answers at once instead of growing an unbounded queue.
    max_waiting_requests: int = flag(
        1024,
        forwarded_by=(SERVE,),
        help="requests queued across all workers before Generate answers RESOURCE_EXHAUSTED",
    )
    # Multi-step decoding (vLLM's name): a step in which every running request is a
    # decode plans up to this many decode steps at once, which the worker runs back
    # to back, so the scheduler-worker round trip is paid once per K tokens. A
    # request that stops early drops the tokens sampled past its end; requests that
    # arrive meanwhile wait at most K - 1 more forwards.
    num_scheduler_steps: int = flag(
        1,
        forwarded_by=(SERVE, BENCH),
        help="decode steps one plan may cover when every running request is decoding "
        "(1: a plan per token)",
    )
    # Only full KV blocks are shared.
    enable_prefix_caching: bool = flag(
        True,
        forwarded_by=(SERVE,),
        help="share the KV of equal prompt prefixes between requests",
    )
    # How often requests behind a waiting request may be admitted while it does
    # not fit, before the queue stops at it until it does (no starvation).
    max_bypasses: int = 16
    # Fraction of the pool kept free when admitting beside running requests, so
    # that their decodes do not need a preemption at every block boundary.
    watermark: float = 0.01
    # "static" is the pre-continuous-batching baseline the benchmark compares against.
    batching: str = flag(
        "continuous",
        choices=BATCHING_MODES,
        forwarded_by=(SERVE,),
        help="continuous: requests join and leave at every step; static: a batch runs "
        "until all its requests finish before new ones join (a baseline)",
    )
    # Async scheduling (see workers/step_loop.py).
    async_scheduling: bool = flag(
        True,
        forwarded_by=(SERVE, BENCH),
        help="plan step N+1 while the worker runs step N, so that the worker never waits "
        "for the scheduler (stop checks lag one step; the extra token is dropped); only "
        "with continuous batching and --num-scheduler-steps 1",
    )

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_num_batched_tokens", "max_waiting_requests")
        for name in (*positive, "num_scheduler_steps"):
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
    def max_steps_in_flight(self) -> int:
        """Plans out at once on a worker: two with async scheduling, where it applies.

        A multi-step plan already hides the round trip behind its steps, and its
        lookahead needs every sample of the plan before it; static batching is the
        baseline of the old loop. Both keep one plan at a time.
        """
        applies = self.batching == "continuous" and self.num_scheduler_steps == 1
        return 2 if self.async_scheduling and applies else 1

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

    def step_deadline_s(self, num_tokens: int) -> float:
        """Seconds a step computing num_tokens may take before its worker counts as hung."""
        return self.worker_timeout_s + num_tokens * self.step_seconds_per_token


@dataclass(frozen=True)
class ProcessConfig:
    """Where `python -m scheduler_svc` listens, and where it finds its workers."""

    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    host: str = flag("0.0.0.0", help="address to listen on")
    port: int = flag(DEFAULT_SCHEDULER_PORT, help="the gRPC port clients connect to")
    worker: list[str] = flag(
        default_factory=list,
        metavar="HOST:PORT",
        help="a worker; repeat for several (or comma-separate). Each must answer at start; "
        "a lost one is reconnected for as long as the scheduler runs",
    )
    worker_dns: str | None = flag(
        None,
        metavar="NAME:PORT",
        help="follow every A/AAAA address behind NAME (e.g. a Kubernetes headless Service) "
        "as a worker on PORT: addresses that appear are added, those that vanish dropped",
    )
    worker_dns_interval_s: float = flag(
        5.0,
        name="worker-dns-interval",
        metavar="SECONDS",
        help="how often --worker-dns is resolved again",
    )
    worker_hosts_file: str | None = flag(
        None,
        metavar="PATH",
        help="resolve --worker-dns from this file of `IP NAME` lines (the /etc/hosts "
        "format, re-read at every lookup) instead of DNS: for tests and hosts without DNS",
    )
    tokenizer: str | None = flag(
        None,
        metavar="DIR",
        default_help="the converted default model",
        help="Hugging Face model directory to read the tokenizer and chat template from",
    )
    metrics_port: int = flag(
        DEFAULT_METRICS_PORT,
        help="serve Prometheus metrics at http://HOST:PORT/metrics; 0 turns them off",
    )
    worker_connect_timeout_s: float = flag(
        120.0,
        name="worker-connect-timeout",
        metavar="SECONDS",
        help="seconds to wait at start for a first --worker to answer (the others, and any "
        "still loading, are retried while the scheduler runs); workers found through "
        "--worker-dns are retried for as long as they are listed",
    )
    log_level: str = flag("info", help="debug, info, warning, error")
    api_processes: int = flag(
        0,
        metavar="N",
        forwarded_by=(SERVE, BENCH),
        help="run the API edge (gRPC and HTTP servers, validation, tokenizing, "
        "detokenizing, stop strings, streaming) in N processes beside this one, which "
        "then only schedules and drives the workers (vLLM's --api-server-count); they "
        "share the gRPC and HTTP ports. 0: everything in this one process",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.api_processes <= MAX_API_PROCESSES:
            raise ValueError(
                f"api_processes must be in [0, {MAX_API_PROCESSES}], got {self.api_processes}"
            )
        if not self.worker and not self.worker_dns:
            raise ValueError("give at least one --worker HOST:PORT or a --worker-dns NAME:PORT")
        if self.worker_dns is not None:
            try:
                parse_target(self.worker_dns)
            except ValueError as error:
                raise ValueError(f"worker_dns: {error}") from None
        interval = self.worker_dns_interval_s
        if not interval > 0:
            raise ValueError(f"worker_dns_interval_s must be > 0, got {interval}")
        object.__setattr__(self, "metrics_port", port_or_off("metrics_port", self.metrics_port))


@dataclass(frozen=True)
class EdgeConfig:
    """The doors: the OpenAI-compatible HTTP front, API keys (also from CBSERVE_API_KEY,
    as vLLM's VLLM_API_KEY) and TLS, to clients and to workers."""

    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    # Off by default for the bare process, so that several schedulers on one host (the
    # tests, a second replica) do not fight over one port; the launchers turn it on.
    http_port: int = flag(
        0,
        help="serve the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics, /version) on this port; 0 turns it off",
    )
    api_key: list[str] = flag(
        default_factory=list,
        metavar="KEY",
        env_aliases=("CBSERVE_API_KEY",),
        forwarded_by=(SERVE,),
        secret=True,
        help="refuse requests without this key (HTTP: `Authorization: Bearer KEY`, 401; gRPC: "
        "`authorization` metadata, UNAUTHENTICATED); repeat for several. Health and "
        "metrics stay open",
    )
    tls_cert: str | None = flag(
        None,
        metavar="PEM",
        forwarded_by=(SERVE,),
        help="serve gRPC and HTTP over TLS with this certificate chain (with --tls-key)",
    )
    tls_key: str | None = flag(
        None, metavar="PEM", forwarded_by=(SERVE,), help="the private key of --tls-cert"
    )
    worker_tls_ca: str | None = flag(
        None,
        metavar="PEM",
        help="connect to workers over TLS, trusting the CA certificates in this file",
    )
    worker_tls_cert: str | None = flag(
        None,
        metavar="PEM",
        help="the scheduler's client certificate for workers that require one "
        "(their --tls-client-ca), with --worker-tls-key",
    )
    worker_tls_key: str | None = flag(
        None, metavar="PEM", help="the private key of --worker-tls-cert"
    )
    # Pod IPs (--worker-dns) are rarely in a certificate; a Service's DNS name is.
    worker_tls_server_name: str | None = flag(
        None,
        metavar="NAME",
        help="with --worker-tls-ca: the name workers' certificates must carry, instead of "
        "the host dialled (for workers addressed by IP, e.g. through --worker-dns)",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "http_port", port_or_off("http_port", self.http_port))
        if any(not key or key != key.strip() for key in self.api_key):
            raise ValueError("api_key must not be empty or start or end with whitespace")
        for first, second in (("tls_cert", "tls_key"), ("worker_tls_cert", "worker_tls_key")):
            if (getattr(self, first) is None) != (getattr(self, second) is None):
                raise ValueError(f"{first} and {second} go together: give both or neither")
        if self.worker_tls_cert and not self.worker_tls_ca:
            raise ValueError("worker_tls_cert needs worker_tls_ca (client certificates need TLS)")
        if self.worker_tls_server_name is not None and not self.worker_tls_ca:
            raise ValueError("worker_tls_server_name needs worker_tls_ca (it names a TLS peer)")
        if self.worker_tls_server_name is not None and not self.worker_tls_server_name.strip():
            raise ValueError("worker_tls_server_name must not be empty")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def worker_tls(self) -> bool:
        return self.worker_tls_ca is not None


# Every config `python -m scheduler_svc` builds from its flags.
SCHEDULER_CONFIGS = (ProcessConfig, SchedulerConfig, FaultConfig, EdgeConfig)
