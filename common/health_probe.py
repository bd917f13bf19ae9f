"""python -m common.health_probe ADDRESS [--service NAME] [--timeout SECONDS]
[--tls-ca PEM [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]]

Asks the standard gRPC health service (grpc.health.v1.Health/Check) at ADDRESS and
exits 0 only when the answer is SERVING. Everything else (NOT_SERVING, an unknown
service, nothing listening, a timeout) exits 1 with one line on stderr saying why.

docker-compose health checks run this inside the containers: the image has Python and
grpcio but no grpc_health_probe binary, and Docker's HEALTHCHECK only reads exit codes
(0 healthy, 1 unhealthy; 2 is reserved, so it is never used here). Kubernetes does not
need it: its native `grpc:` probes speak the same protocol.

The default service name "" is the server's overall status. On the scheduler that is
SERVING only while at least one worker is connected, so a healthy scheduler can serve.

A port served over TLS is probed with --tls-ca (the CA that signed its certificate);
a worker with --tls-client-ca also wants a client certificate (--tls-cert/--tls-key)
before it answers anything, health included. Inside a container the probe dials
localhost: --tls-server-name names what the certificate carries instead.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.tls import ChannelSecurity, TlsError, channel_security, open_channel

EXIT_SERVING = 0
EXIT_UNHEALTHY = 1


def check(
    address: str, service: str = "", timeout: float = 3.0, security: ChannelSecurity | None = None
) -> tuple[bool, str]:
    """(serving, reason): one Check call with a deadline, so that a hung server
    counts as unhealthy instead of hanging the probe past Docker's own timeout.
    security: TLS (common.tls.channel_security); None for plaintext."""
    # A plain channel without our keepalive options: a probe lives for one call.
    with open_channel(address, security, asyncio=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout,
                # Fail the call (UNAVAILABLE) instead of waiting for a server
                # that is not listening yet; the deadline still bounds a slow one.
                wait_for_ready=False,
            )
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return False, f"{address}: unknown service {service!r}"
            return False, f"{address}: {code.name}: {error.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    label = f"service {service!r}" if service else "overall status"
    return response.status == health_pb2.HealthCheckResponse.SERVING, (
        f"{address}: {label} {status}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m common.health_probe",
        description="exit 0 when the gRPC health service at ADDRESS reports SERVING",
    )
    parser.add_argument("address", metavar="ADDRESS", help="HOST:PORT of the server")
    parser.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help='service to ask about, e.g. cbserve.v1.Generation (default "": overall status)',
    )
    parser.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)"
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing when SERVING")
    tls = parser.add_argument_group("TLS (a server started with --tls-cert)")
    tls.add_argument("--tls-ca", metavar="PEM", help="speak TLS, trusting this CA")
    tls.add_argument("--tls-cert", metavar="PEM", help="client certificate (mutual TLS)")
    tls.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    tls.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the server's certificate carries"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    security = None
    if args.tls_ca is not None:
        try:
            security = channel_security(
                args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name
            )
        except TlsError as error:
            print(f"health_probe: unhealthy: {error}", file=sys.stderr)
            return EXIT_UNHEALTHY
    elif args.tls_cert or args.tls_key or args.tls_server_name:
        parser.error("--tls-cert, --tls-key and --tls-server-name need --tls-ca")
    serving, reason = check(args.address, args.service, args.timeout, security)
    if serving:
        if not args.quiet:
            print(reason)
        return EXIT_SERVING
    print(f"health_probe: unhealthy: {reason}", file=sys.stderr)
    return EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
