"""Network addresses as flags give them."""

from __future__ import annotations


def parse_target(value: str) -> tuple[str, int]:
    """NAME:PORT (or [IPv6]:PORT) -> (host, port); raises ValueError."""
    host, separator, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected NAME:PORT, got {value!r}")
    return host, int(port)
