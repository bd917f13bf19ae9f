"""TLS credentials for both processes' gRPC ports and channels, read from PEM files.

Every file is read and checked when the process starts, so that a wrong path, a file
that is not PEM, or a key that does not belong to its certificate fails the start with
one line naming the file, instead of failing every handshake later with grpc's
"handshake failed" and nothing else. The checks use Python's own `ssl` module, which
reads the same PEM the grpc core does.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


class TlsError(ValueError):
    """A PEM file that cannot serve: missing, unreadable, not PEM, or a mismatched key."""


def read_pem(path: str | Path, label: str) -> bytes:
    """The bytes of a PEM file; TlsError, naming the flag (`label`) and the path, when
    it cannot be read or is not PEM."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TlsError(f"{label} {path}: {error.strerror or error}") from error
    if b"-----BEGIN " not in data:
        raise TlsError(f"{label} {path}: not a PEM file (no -----BEGIN line)")
    return data


def _check_pair(cert_path: str, key_path: str, labels: tuple[str, str]) -> tuple[bytes, bytes]:
    """The certificate chain and key, checked to belong together."""
    cert = read_pem(cert_path, labels[0])
    key = read_pem(key_path, labels[1])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as error:
        if "KEY_VALUES_MISMATCH" in str(error):
            raise TlsError(
                f"{labels[1]} {key_path} is not the key of {labels[0]} {cert_path}"
            ) from error
        raise TlsError(
            f"{labels[0]} {cert_path} and {labels[1]} {key_path}: not a PEM certificate "
            f"chain and its private key ({error.reason or error})"
        ) from error
    return cert, key


def _check_ca(ca_path: str, label: str) -> bytes:
    data = read_pem(ca_path, label)
    try:
        ssl.create_default_context(cafile=ca_path)
    except ssl.SSLError as error:
        raise TlsError(f"{label} {ca_path}: no CA certificate in it ({error.reason})") from error
    return data


def server_credentials(
    cert: str,
    key: str,
    client_ca: str | None = None,
    *,
    labels: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-client-ca"),
) -> grpc.ServerCredentials:
    """A server's TLS credentials; with `client_ca`, clients must present a certificate
    that CA signed (mutual TLS), or the handshake fails. `labels` name the three files
    in errors (the flags they came from)."""
    cert_pem, key_pem = _check_pair(cert, key, labels[:2])
    ca_pem = _check_ca(client_ca, labels[2]) if client_ca else None
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None
    )


@dataclass(frozen=True)
class ChannelSecurity:
    """How a channel reaches a TLS server: its credentials, and the name the server's
    certificate must carry when it is not the host dialled (a worker dialled by IP)."""

    credentials: grpc.ChannelCredentials
    server_name: str | None = None

    def options(self) -> list[tuple[str, str]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def open_channel(
    address: str, security: ChannelSecurity | None, options=(), *, asyncio: bool = True
):
    """A channel to address, plaintext when security is None, else TLS with its
    credentials and server name: the one way every client here (the scheduler's worker
    client, cbserve.Client, the health probe) opens one. asyncio: grpc.aio's, else sync."""
    if security is None:
        insecure = grpc.aio.insecure_channel if asyncio else grpc.insecure_channel
        return insecure(address, options=list(options))
    secure = grpc.aio.secure_channel if asyncio else grpc.secure_channel
    return secure(address, security.credentials, options=[*options, *security.options()])


def channel_security(
    ca: str | Path | bytes,
    cert: str | None = None,
    key: str | None = None,
    server_name: str | None = None,
    *,
    labels: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key"),
) -> ChannelSecurity:
    """A client's TLS: trust the CA in `ca` (a path, or the PEM bytes themselves), and
    present cert/key to servers that ask for one (mutual TLS)."""
    ca_pem = ca if isinstance(ca, bytes) else _check_ca(str(ca), labels[0])
    cert_pem = key_pem = None
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise TlsError(f"{labels[1]} and {labels[2]} go together: give both or neither")
        cert_pem, key_pem = _check_pair(cert, key, labels[1:])
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )
    return ChannelSecurity(credentials, server_name)
