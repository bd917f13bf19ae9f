"""Where a transfer's chunks land, against the blocks steps take meanwhile.

The destination writes chunks without the runner's lock (receiver.py): while the
transfer lives, no plan names its blocks. But when the transfer fails at the source
(the source died, the network broke) the scheduler frees the destination's blocks at
once and may hand them to other KV in its next plan, while this worker is still writing
the chunk in flight, or has not yet seen the stream break and starts another. Such a
late write would overwrite the new KV: a recomputed request would then decode from
corrupted KV (a token changed, silently), which the source-killed drain test caught.

So each transfer keeps the blocks its chunks have written and the blocks steps have
taken since it began, under one lock that each chunk's write holds. A step takes its
newly assigned blocks before it runs (take_step_blocks): it waits for the write in
flight, and if it takes any block of the transfer's, the transfer is abandoned. A chunk
whose blocks a step took, or any chunk after the transfer was abandoned, is refused
(TransferError) instead of written. In a transfer that lives, no step takes its blocks,
and the lock is never waited for.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable

from worker_svc.kv_transfer.layout import TransferError
from worker_svc.step.description import Step


class Landing:
    """One transfer's written blocks and the blocks steps took while it lived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written: set[int] = set()
        self.taken: set[int] = set()
        self.abandoned = False
        # The write in its thread, if any: a cancelled receive leaves it running.
        self._pending: asyncio.Future | None = None

    async def land(self, block_ids: tuple[int, ...], write: Callable[[], None]) -> None:
        """write() on a thread, through self.write (TransferError if a step took a block)."""
        loop = asyncio.get_running_loop()
        self._pending = loop.run_in_executor(None, self.write, block_ids, write)
        await self._pending

    async def settled(self) -> None:
        """Once no write of it runs: a cut stream cancels the receive, not its thread."""
        if self._pending is not None and not self._pending.done():
            await asyncio.wait({self._pending})

    def write(self, block_ids: Iterable[int], write: Callable[[], None]) -> None:
        """Runs write() for these blocks unless a step took one (a thread's work)."""
        ids = set(block_ids)
        with self.lock:
            if self.abandoned or ids & self.taken:
                self.abandoned = True
                raise TransferError(
                    "a step took this transfer's blocks: the scheduler gave the transfer up"
                )
            self.written |= ids
            write()

    def take(self, block_ids: set[int]) -> None:
        with self.lock:
            self.taken |= block_ids
            if block_ids & self.written:
                self.abandoned = True


class Landings:
    """The transfers this worker receives, for the steps to take blocks from."""

    def __init__(self) -> None:
        self._live: dict[int, Landing] = {}

    def open(self) -> Landing:
        landing = Landing()
        self._live[id(landing)] = landing
        return landing

    def close(self, landing: Landing) -> None:
        """Forgotten (after landing.settled(): no write of it runs any more)."""
        self._live.pop(id(landing), None)

    def take_step_blocks(self, step: Step) -> None:
        """Before a step runs (the forward thread): the blocks it newly assigns taken from
        every live transfer."""
        if not self._live:
            return
        ids = {b for seq in step.new_sequences for b in seq.block_ids}
        ids.update(b for seq in step.continuing_sequences for b in seq.new_block_ids)
        if ids:
            for landing in list(self._live.values()):
                landing.take(ids)
