"""The edge's doors: the OpenAI-compatible HTTP front, API keys and TLS, to clients and
to workers (scheduler_svc/api/, grpc_security.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.addresses import port_or_off
from common.flag_fields import SERVE, flag
from scheduler_svc.config.process import ENV_PREFIX


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
