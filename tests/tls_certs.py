"""Test certificates made with the openssl command line, as docs/keys-and-tls.md tells users to.

One throwaway CA signs a server certificate valid for localhost and 127.0.0.1 (the
scheduler's and the workers' ports in the tests) and a client certificate (the
scheduler's, for workers that require mutual TLS). Elliptic-curve keys: made in
milliseconds, so every test session makes its own.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# subjectAltName is what TLS clients check; the CN is only a label.
_SERVER_EXTENSIONS = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
_CLIENT_EXTENSIONS = "extendedKeyUsage=clientAuth\n"


@dataclass(frozen=True)
class TestCertificates:
    __test__ = False  # not a test class, whatever pytest thinks of its name

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _new_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )


def _signed(directory: Path, name: str, ca_cert: Path, ca_key: Path, extensions: str) -> Path:
    """Makes name.key and a name.pem that ca signed; returns the certificate's path."""
    key, request, cert = (directory / f"{name}{suffix}" for suffix in (".key", ".csr", ".pem"))
    extensions_file = directory / f"{name}.ext"
    extensions_file.write_text(extensions)
    _new_key(key)
    _openssl(
        "req", "-new", "-key", str(key), "-subj", f"/CN=cbserve-test-{name}", "-out", str(request)
    )
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(extensions_file),
        "-out", str(cert),
    )  # fmt: skip
    return cert


def make_certificates(directory: Path) -> TestCertificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    _new_key(ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(ca_key), "-subj", "/CN=cbserve-test-ca",
        "-days", "2", "-sha256", "-out", str(ca_cert),
    )  # fmt: skip
    server = _signed(directory, "server", ca_cert, ca_key, _SERVER_EXTENSIONS)
    client = _signed(directory, "client", ca_cert, ca_key, _CLIENT_EXTENSIONS)
    return TestCertificates(
        ca=ca_cert,
        server_cert=server,
        server_key=directory / "server.key",
        client_cert=client,
        client_key=directory / "client.key",
    )
