"""Network addresses and ports as flags give them."""

from __future__ import annotations

import warnings


def parse_target(value: str) -> tuple[str, int]:
    """NAME:PORT (or [IPv6]:PORT) -> (host, port); raises ValueError."""
    host, separator, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected NAME:PORT, got {value!r}")
    return host, int(port)


# A port flag that can be turned off (metrics, HTTP) is off at 0, in every command.
PORT_OFF = 0
# --metrics-port's old spelling of off, still read as PORT_OFF.
DEPRECATED_PORT_OFF = -1


def port_or_off(name: str, value: int) -> int:
    """value checked as a port that 0 turns off; -1 reads as 0, with a warning. Raises
    ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer port, got {value!r}")
    if value == DEPRECATED_PORT_OFF:
        warnings.warn(f"{name} -1 is deprecated: 0 turns it off", FutureWarning, stacklevel=2)
        return PORT_OFF
    if not 0 <= value <= 65535:
        raise ValueError(f"{name} must be in [1, 65535], or 0 to turn it off, got {value}")
    return value
