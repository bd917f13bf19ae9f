"""Progress counted in streamed tokens: the clock of tests that must hold on any CPU.

A test that cancels a request "after 2 s", or sends one "0.3 s after another" to
catch the first mid-flight, assumes how fast the forward is: on a faster CPU the
request it meant to catch has already finished, and the test fails, or passes
without testing what it says. These tests count instead: a cancel fires once a
stream, or the whole run, has streamed k tokens, and a request meant to be caught
running asks for enough tokens that what the test does meanwhile (a few RPCs and
metric scrapes) takes far fewer steps than it has left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class TokenProgress:
    """Tokens streamed so far by every request of a run; callbacks fire at thresholds.

    Single event loop, no locks: `add` is called by the streams as they read."""

    def __init__(self) -> None:
        self.total = 0
        self._pending: list[tuple[int, Callable[[], object]]] = []

    def at(self, tokens: int, callback: Callable[[], object]) -> None:
        """Calls `callback` once `tokens` tokens have been streamed (now, if they have)."""
        if self.total >= tokens:
            callback()
        else:
            self._pending.append((tokens, callback))

    def add(self, count: int) -> None:
        self.total += count
        due = [entry for entry in self._pending if entry[0] <= self.total]
        if due:
            self._pending = [entry for entry in self._pending if entry[0] > self.total]
            for _, callback in due:
                callback()

    async def reached(self, tokens: int) -> None:
        """Returns once `tokens` tokens have been streamed."""
        arrived = asyncio.get_running_loop().create_future()
        self.at(tokens, lambda: arrived.done() or arrived.set_result(None))
        await arrived
