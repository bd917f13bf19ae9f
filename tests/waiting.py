"""Waiting for a state instead of sleeping for a time: the one polling loop of the tests.

A test that sleeps "long enough" for something to happen (the cancel to reach the
scheduler, the worker to pick up a plan) fails on a slower machine and, worse, may
pass on a faster one without testing what it says. These helpers poll for the
state itself, at a short interval, and fail with what was awaited (and the last
state seen, if `what` is a callable that reads it) once `timeout_s` has passed.
The timeout only bounds a failure: a passing test never waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

What = str | Callable[[], str]


def _failure(what: What, timeout_s: float) -> AssertionError:
    described = what() if callable(what) else what
    return AssertionError(f"not true after {timeout_s:g} s: {described}")


def wait_until(
    what: What, check: Callable[[], object], timeout_s: float = 60.0, interval_s: float = 0.05
) -> float:
    """Polls check() until it is true; returns the seconds that took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise _failure(what, timeout_s)
        time.sleep(interval_s)
    return time.monotonic() - started


async def wait_until_async(
    what: What, check: Callable[[], object], timeout_s: float = 60.0, interval_s: float = 0.01
) -> float:
    """wait_until inside an event loop: the loop runs (streams are read) between polls.

    check() runs on the loop, so it must be quick (one /metrics scrape is)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise _failure(what, timeout_s)
        await asyncio.sleep(interval_s)
    return time.monotonic() - started
