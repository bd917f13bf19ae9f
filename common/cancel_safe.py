"""Waits with a timeout that never lose a cancellation.

On Python 3.10 and 3.11, asyncio.wait_for swallows a cancel that arrives in
the same loop iteration as the awaited thing completes: it returns the result
and the caller runs on as if never cancelled (CPython gh-86296, fixed in 3.12
by rebuilding wait_for on asyncio.timeout). A long-lived loop that waits this
way in every iteration (a step loop awaiting its worker's answer, an idle loop
awaiting its wakeup) then survives Task.cancel(), and whoever awaits it after
cancelling waits for ever: the scheduler's removal of a worker that left DNS
hung exactly so. asyncio.wait never cancels or swallows anything, so these
helpers wait with it.
"""

from __future__ import annotations

import asyncio

__all__ = ["cancel_and_wait", "done_within", "set_within"]


async def done_within(future: asyncio.Future, timeout_s: float | None) -> bool:
    """Whether the future finished within timeout_s (None: no limit). The future is
    left as it is either way; a cancel of the caller always raises here."""
    done, _ = await asyncio.wait({future}, timeout=timeout_s)
    return bool(done)


async def set_within(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Whether the event was set within timeout_s (None: no limit)."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        return await done_within(waiter, timeout_s)
    finally:
        waiter.cancel()


async def cancel_and_wait(task: asyncio.Task) -> None:
    """Cancels the task and waits until it has ended, cancelling again should some
    library code below it swallow a cancel. Whatever the task ends with is dropped."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
