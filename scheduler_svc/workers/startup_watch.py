"""When a scheduler started with --worker may serve: the first answer of each worker.

A scheduler, its workers, a process manager and a compose file start in any order,
and a worker answers UNAVAILABLE while it loads its model (tens of seconds). So the
static workers are connected in the background from the start, each retried with the
reconnect backoff, and the scheduler serves once one of them is connected and every
other one has either connected or failed an attempt: workers that are up are all in
the pool before the first request, and none that is still loading holds the others
up. None ready within --worker-connect-timeout is fatal, with each worker's last
reason in the message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


class NoWorkerReady(Exception):
    """No static worker connected within --worker-connect-timeout."""


class StartupWatch:
    def __init__(self, addresses: Sequence[str]) -> None:
        self._addresses = list(addresses)
        self._connected: set[str] = set()
        # The last reason each worker not (yet) connected gave.
        self._last_failure: dict[str, str] = {}
        self.settled = asyncio.Event()

    def connected(self, address: str) -> None:
        self._connected.add(address)
        self._last_failure.pop(address, None)
        self._check()

    def failed(self, address: str, reason: str) -> None:
        if address not in self._connected:
            self._last_failure[address] = reason
        self._check()

    @property
    def waiting(self) -> list[str]:
        """Workers not connected yet, in the order given."""
        return [address for address in self._addresses if address not in self._connected]

    def _check(self) -> None:
        tried = self._connected | self._last_failure.keys()
        if self._connected and tried.issuperset(self._addresses):
            self.settled.set()

    def why_none_ready(self, timeout_s: float) -> str:
        reasons = "; ".join(
            f"{address}: {self._last_failure.get(address, 'unreachable: nothing answered')}"
            for address in self.waiting
        )
        return f"no worker ready after {timeout_s:g}s ({reasons})"
