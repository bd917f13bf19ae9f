"""One replica's prefix cache as one event stream, whatever its number of workers.

A router sees a replica as one endpoint (one pod, one topic `kv@<pod-ip>:<port>@<model>`),
and a request sent there is placed on whichever worker caches most of its prompt
(pool placement), so what the router needs is the union of the workers' prefix caches.
Each worker's BlockManager reports to this one object: a block is announced
(BlockStored) when the first worker caches its hash and withdrawn (BlockRemoved) when
the last one evicts it; a worker that is lost or removed takes its whole cache with it
(withdraw). AllBlocksCleared opens the stream (a new process holds nothing, whatever
an earlier one at the same address published) and follows any withdrawal that leaves
the replica with nothing cached.

Events are batched: the first event of a loop iteration schedules one flush
(call_soon), which hands the whole batch, usually one step's, to the publisher (a
queue put; the encoding and the socket are its thread's). Outside an event loop (the
in-process tests) the owner calls flush().
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from scheduler_svc.kv_events.wire import Event, all_blocks_cleared, block_removed, block_stored

if TYPE_CHECKING:
    from scheduler_svc.lora.registry import AdapterInfo

Publish = Callable[[float, list[Event]], None]


class ReplicaKVEvents:
    def __init__(self, publish: Publish, clock: Callable[[], float] = time.time) -> None:
        self._publish = publish
        self._clock = clock
        # Hash -> how many workers' prefix caches hold it.
        self._holders: dict[int, int] = {}
        self._pending: list[Event] = []
        self._flush_scheduled = False
        self._add(all_blocks_cleared())

    # -- what a BlockManager reports (core.block_manager.BlockEvents) -------------------

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        adapter: AdapterInfo | None = None,
    ) -> None:
        holders = self._holders
        run_start: int | None = None
        for index, block_hash in enumerate(block_hashes):
            count = holders.get(block_hash, 0)
            holders[block_hash] = count + 1
            if count == 0 and run_start is None:
                run_start = index
            elif count > 0 and run_start is not None:
                # Another worker holds this one already: the new run ends before it.
                self._stored_run(
                    block_hashes, parent_hash, token_ids, block_size, run_start, index, adapter
                )
                run_start = None
        if run_start is not None:
            end = len(block_hashes)
            self._stored_run(
                block_hashes, parent_hash, token_ids, block_size, run_start, end, adapter
            )

    def _stored_run(self, hashes, parent_hash, token_ids, block_size, start, end, adapter) -> None:
        parent = hashes[start - 1] if start else parent_hash
        tokens = token_ids[start * block_size : end * block_size]
        lora = (None, None) if adapter is None else (adapter.lora_id, adapter.name)
        self._add(block_stored(hashes[start:end], parent, tokens, block_size, *lora))

    def removed(self, block_hash: int) -> None:
        if self._release(block_hash):
            self._add(block_removed([block_hash]))

    # -- what the engines report --------------------------------------------------------

    def withdraw(self, block_hashes: Iterable[int]) -> None:
        """A worker's whole prefix cache is gone (lost, reconnecting, or removed)."""
        gone = [block_hash for block_hash in block_hashes if self._release(block_hash)]
        if gone:
            self._add(block_removed(gone))
        if not self._holders:
            self._add(all_blocks_cleared())

    def _release(self, block_hash: int) -> bool:
        """One holder fewer; whether it was the last."""
        count = self._holders.get(block_hash, 0)
        if count <= 1:
            self._holders.pop(block_hash, None)
            return count == 1
        self._holders[block_hash] = count - 1
        return False

    # -- the replica's view, and the batches --------------------------------------------

    @property
    def cached_hashes(self) -> set[int]:
        """Hashes some worker of the replica caches, as the stream has told them."""
        return set(self._holders)

    def _add(self, event: Event) -> None:
        self._pending.append(event)
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the owner flushes
        self._flush_scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Publishes the events gathered since the last flush, as one batch."""
        self._flush_scheduled = False
        if self._pending:
            events, self._pending = self._pending, []
            self._publish(self._clock(), events)
