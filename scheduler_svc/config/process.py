"""The scheduler process: where it listens, where it finds its workers, and the
prefix of every flag's variable.

Every scheduler config is `python -m scheduler_svc`'s flags (common.cli_config): each
`flag(...)` field is one, with the variable CBSERVE_SCHEDULER_<FLAG> (ENV_PREFIX);
those marked `forwarded_by` are `cbserve serve`'s (and `cbserve bench`'s) too.
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
    prefill_worker: list[str] = flag(
        default_factory=list,
        metavar="HOST:PORT",
        help="a worker that runs new requests' prefills only: each request's KV then moves "
        "to a --worker (decode) worker, which decodes it; a prompt the decode side's prefix "
        "cache holds but for its last block skips it. Repeat for several (or comma-separate)",
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
        metavar="PATH",
        default_help="the converted default model",
        help="Hugging Face model directory, or .gguf file, to read the tokenizer and chat "
        "template from",
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
        both = set(self.worker) & set(self.prefill_worker)
        if both:
            raise ValueError(f"a worker is either --worker or --prefill-worker: {sorted(both)}")
        if self.worker_dns is not None:
            try:
                parse_target(self.worker_dns)
            except ValueError as error:
                raise ValueError(f"worker_dns: {error}") from None
        interval = self.worker_dns_interval_s
        if not interval > 0:
            raise ValueError(f"worker_dns_interval_s must be > 0, got {interval}")
        object.__setattr__(self, "metrics_port", port_or_off("metrics_port", self.metrics_port))
