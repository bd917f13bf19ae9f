"""How a client reaches the scheduler: its channel (plaintext, or TLS trusting a CA)
and the metadata every call carries (the API key).

The key is sent per call as `authorization: Bearer KEY`, the metadata the scheduler's
--api-key checks, rather than as gRPC call credentials: those are refused on a
plaintext channel, and a scheduler on a private network may want a key without TLS.
"""

from __future__ import annotations

import os

from cbserve.retry import RetryPolicy, channel_options
from common import tls
from common.tls import channel_security

# Where `cbserve generate/info` find the key when --api-key is not given; the scheduler
# reads the same variable (comma-separated for several keys: a client sends the first).
API_KEY_ENV = "CBSERVE_API_KEY"
Metadata = tuple[tuple[str, str], ...]


def call_metadata(api_key: str | None) -> Metadata | None:
    """The metadata of every call: the key, if any (ValueError for an unusable one)."""
    if api_key is None:
        return None
    if not api_key or api_key != api_key.strip() or not api_key.isprintable():
        raise ValueError("api_key must be non-empty printable text without surrounding spaces")
    return (("authorization", f"Bearer {api_key}"),)


def api_key_from_env() -> str | None:
    """The first key of CBSERVE_API_KEY, or None when it is unset or empty."""
    keys = [key.strip() for key in os.environ.get(API_KEY_ENV, "").split(",")]
    return next((key for key in keys if key), None)


def open_channel(
    address: str,
    retry: RetryPolicy | None,
    tls_ca: str | os.PathLike | bytes | None,
    *,
    asyncio: bool,
):
    """A channel to `address` with the retry policy; TLS when `tls_ca` is given (a PEM
    file's path, or its bytes): the server's certificate must be signed by that CA and
    name the host in `address`."""
    security = None
    if tls_ca is not None:
        ca = tls_ca if isinstance(tls_ca, bytes) else os.fspath(tls_ca)
        security = channel_security(ca, labels=("tls_ca", "", ""))
    return tls.open_channel(address, security, channel_options(retry), asyncio=asyncio)
