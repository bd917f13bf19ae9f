"""Starting a grpc.aio server with health and reflection, the same way in both processes."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.grpc_options import SERVER_OPTIONS


class PortUnavailable(Exception):
    pass


def create_server(
    address: str,
    *,
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    share_port: bool = False,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """A server bound to `address` with the health service, and the port it bound
    (the real one when `address` asks for port 0). Binding happens here, before
    any slow start-up work, so that a taken port fails at once.

    credentials: serve TLS (common.tls.server_credentials) instead of plaintext; a
    plaintext client is then refused at the handshake. interceptors: see every call
    first (the scheduler's API key check). share_port: SO_REUSEPORT, for the API
    processes of one scheduler, which listen on one port (a port held by another
    program that did not ask to share still fails the start)."""
    options = SERVER_OPTIONS
    if share_port:
        options = [(key, 1 if key == "grpc.so_reuseport" else value) for key, value in options]
    server = grpc.aio.server(options=options, interceptors=list(interceptors))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as error:
        raise PortUnavailable(f"cannot listen on {address}: {error}") from error
    if bound == 0:
        raise PortUnavailable(f"cannot listen on {address}: port in use or not allowed")
    return server, health_servicer, bound


def enable_reflection(server: grpc.aio.Server, service_names: list[str]) -> None:
    reflection.enable_server_reflection(
        [
            *service_names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )


async def set_serving(health_servicer, service_names: list[str], serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    # "" is the server's overall status, the one probes ask for by default.
    for name in ["", *service_names]:
        await health_servicer.set(name, status)
