"""The scheduler's doors to the outside: the OpenAI-compatible HTTP front, API keys
and TLS, validated once at construction.

They are `python -m scheduler_svc`'s flags like the other configs (common.cli_config),
with the variables CBSERVE_SCHEDULER_<FLAG>; the keys may also come from
CBSERVE_API_KEY (vLLM's VLLM_API_KEY plays that part), comma-separated for several.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.flag_fields import flag

ENV_PREFIX = "CBSERVE_SCHEDULER_"
# The port `cbserve serve`, `make run` and the compose stack give the HTTP front.
DEFAULT_HTTP_PORT = 8000


@dataclass(frozen=True)
class EdgeConfig:
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
        help="refuse requests without this key (HTTP: `Authorization: Bearer KEY`, 401; gRPC: "
        "`authorization` metadata, UNAUTHENTICATED); repeat for several. Health and "
        "metrics stay open",
    )
    tls_cert: str | None = flag(
        None,
        metavar="PEM",
        help="serve gRPC and HTTP over TLS with this certificate chain (with --tls-key)",
    )
    tls_key: str | None = flag(None, metavar="PEM", help="the private key of --tls-cert")
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
    # Workers found by --worker-dns are dialled by IP (a headless Service's pod IPs),
    # which their certificate rarely names; one name that every worker's does carry
    # (e.g. the Service's DNS name) is checked instead.
    worker_tls_server_name: str | None = flag(
        None,
        metavar="NAME",
        help="with --worker-tls-ca: the name workers' certificates must carry, instead of "
        "the host dialled (for workers addressed by IP, e.g. through --worker-dns)",
    )

    def __post_init__(self) -> None:
        port = self.http_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"http_port must be an integer in [0, 65535], got {port!r}")
        if any(not key or key != key.strip() for key in self.api_key):
            raise ValueError("api_key must not be empty or start or end with whitespace")
        _pair("tls_cert", self.tls_cert, "tls_key", self.tls_key)
        _pair("worker_tls_cert", self.worker_tls_cert, "worker_tls_key", self.worker_tls_key)
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


def _pair(first: str, first_value, second: str, second_value) -> None:
    if (first_value is None) != (second_value is None):
        raise ValueError(f"{first} and {second} go together: give both or neither")
