"""The scheduler's gRPC security, made from EdgeConfig at start: TLS and the key
check on its own port, and TLS (mutual, with a client certificate) to its workers.

Every PEM file is read and checked here (common.tls), before the port opens, so a
wrong path or a key that does not match its certificate fails the start with one
line (common.tls.TlsError, a ValueError).
"""

from __future__ import annotations

import grpc

from common.tls import ChannelSecurity, channel_security, server_credentials
from scheduler_svc.api.grpc_auth import interceptors_for
from scheduler_svc.config.edge import EdgeConfig


def grpc_server_security(
    edge: EdgeConfig,
) -> tuple[grpc.ServerCredentials | None, list[grpc.aio.ServerInterceptor]]:
    """(credentials, interceptors) for common.grpc_server.create_server: TLS with
    --tls-cert/--tls-key (None: plaintext), the key check with --api-key."""
    credentials = None
    if edge.tls:
        credentials = server_credentials(edge.tls_cert, edge.tls_key)
    return credentials, interceptors_for(edge.api_key)


def worker_channel_security(edge: EdgeConfig) -> ChannelSecurity | None:
    """TLS to the workers with --worker-tls-ca (None: plaintext); with
    --worker-tls-cert/--worker-tls-key the scheduler shows its certificate to
    workers that require one (their --tls-client-ca)."""
    if not edge.worker_tls:
        return None
    return channel_security(
        edge.worker_tls_ca,
        edge.worker_tls_cert,
        edge.worker_tls_key,
        edge.worker_tls_server_name,
        labels=("--worker-tls-ca", "--worker-tls-cert", "--worker-tls-key"),
    )
