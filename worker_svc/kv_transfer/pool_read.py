"""The one-copy path between two workers on one host: the destination copies the moved
blocks straight out of the source's pool into its own.

A source whose CPU pool is in shared memory (--kv-pool-shared: worker_svc/
shared_kv_memory.py) offers it in ReceiveKv's metadata (POOL_OFFER_KEY: "PID FD BYTES
NONCE"); the destination opens /proc/PID/fd/FD, maps it read-only, checks the nonce in
the page after the pool, and answers POOL_ACCEPTED. Each chunk then names source block
ids beside the destination's (KvChunk.source_block_ids) and carries no bytes: its
filled slots are copied, every layer's K and V, with one strided copy per run of ids
consecutive on both sides. Nothing is gathered into a ring first, and no header
counts chunks: the source needs no slot back.

Why the source's blocks are not rewritten while they are read: the scheduler sends only
a request it has parked and settled (no plan in flight or to come writes its blocks),
and it frees them only once SendKv answered, which is after the destination's ReceiveKv
answered, so after every chunk's copy returned (receiver.py waits for its writes). A
transfer that fails (either end killed, a deadline) may leave a copy running at the
destination while the source's blocks are freed and rewritten: what it copies lands
only in destination blocks the scheduler frees at once for recompute, and a step that
takes any of them waits for that copy and abandons the transfer (landing.py).

A mapping is kept between transfers from the same source (SourcePools): mapping a pool
anew costs its page faults on every copy and an unmap after, about as much as the copy
itself. It is dropped once its source is gone, so that a destination does not keep a
dead worker's pool in memory: checked at each transfer and every SWEEP_S while any is
kept, and at once after a transfer that failed (its source may have died mid-way).
"""

from __future__ import annotations

import asyncio

from worker_svc.kv_pool import KVPool
from worker_svc.kv_transfer.layout import TransferError, check_chunk
from worker_svc.shared_kv_memory import MappedSourcePool

# ReceiveKv's request metadata: the source's pool offer; and the destination's answer
# (under shm.HANDSHAKE_KEY) when it mapped it.
POOL_OFFER_KEY = "cbserve-kv-pool"
POOL_ACCEPTED = "pool"
# About how much a chunk copies on this path: no message carries the bytes and no ring
# holds them, so a chunk is only a message and a thread hop per this many bytes; small
# enough that a step taking blocks from a transfer given up waits little (landing.py).
POOL_CHUNK_TARGET_BYTES = 16 * 1024 * 1024
# How often the kept mappings are checked for a source that went.
SWEEP_S = 5.0


class SourcePool:
    """The source's pool, mapped read-only for one transfer."""

    def __init__(self, mapped: MappedSourcePool) -> None:
        self.mapped = mapped
        self._cache = None
        self.users = 0  # transfers copying from it now
        self.failed = False  # a transfer from it failed: not kept

    @classmethod
    def attach(cls, offer: str) -> SourcePool:
        """OSError or ValueError where it cannot be mapped, or is not the offered pool."""
        return cls(MappedSourcePool.attach(offer))

    def cache(self, pool: KVPool):
        """The source's pool as a tensor laid out as `pool`'s (whose layout the first
        chunk checked: the same but for the number of blocks)."""
        if self._cache is None:
            spec = pool.spec
            num_blocks, rest = divmod(self.mapped.nbytes, spec.bytes_per_block)
            if rest or not num_blocks:
                raise TransferError(
                    f"the source's pool of {self.mapped.nbytes} bytes is not whole blocks "
                    f"of {spec.bytes_per_block}"
                )
            shape = (spec.num_layers, 2, num_blocks, spec.block_size)
            shape += (spec.num_kv_heads, spec.head_dim)
            self._cache = self.mapped.tensor(shape, spec.dtype)
        return self._cache

    def close(self) -> None:
        self._cache = None
        self.mapped.close()


class SourcePools:
    """The source pools this destination has mapped, kept between transfers (the event
    loop's; closes on a thread)."""

    def __init__(self) -> None:
        self._pools: dict[str, SourcePool] = {}
        self._sweep_timer: asyncio.TimerHandle | None = None

    def open(self, offer: str) -> SourcePool:
        """The offered pool, mapped or kept (OSError or ValueError: SourcePool.attach)."""
        self.sweep()
        source = self._pools.get(offer)
        if source is None:
            source = self._pools[offer] = SourcePool.attach(offer)
        source.users += 1
        if self._sweep_timer is None:
            self._sweep_timer = asyncio.get_running_loop().call_later(SWEEP_S, self._swept)
        return source

    def done(self, source: SourcePool, failed: bool) -> None:
        source.users -= 1
        source.failed |= failed
        self.sweep()

    def sweep(self) -> None:
        """Unmaps the pools no transfer uses whose source is gone or failed one."""
        for offer, source in list(self._pools.items()):
            if not source.users and (source.failed or not source.mapped.source_alive()):
                del self._pools[offer]
                asyncio.get_running_loop().run_in_executor(None, source.close)

    def _swept(self) -> None:
        self._sweep_timer = None
        self.sweep()
        if self._pools:
            self._sweep_timer = asyncio.get_running_loop().call_later(SWEEP_S, self._swept)

    def __len__(self) -> int:
        return len(self._pools)


def copy_chunk(pool: KVPool, chunk, source: SourcePool) -> None:
    """A chunk naming source blocks checked (TransferError) and its filled slots copied
    from the source's pool into this one's (a thread's work)."""
    check_chunk(pool, chunk)
    source_cache = source.cache(pool)
    source_ids = tuple(chunk.source_block_ids)
    bad = [b for b in source_ids if not 0 <= b < source_cache.shape[2]]
    if bad:
        raise TransferError(f"source block ids out of range 0..{source_cache.shape[2] - 1}: {bad}")
    destination_ids = tuple(chunk.destination_block_ids)
    for src, dst, count in paired_runs(source_ids, destination_ids, tuple(chunk.filled_slots)):
        n = -(-count // pool.block_size)
        into = pool.cache[:, :, dst : dst + n].flatten(2, 3)[:, :, :count]
        into.copy_(source_cache[:, :, src : src + n].flatten(2, 3)[:, :, :count])


def paired_runs(source_ids, destination_ids, filled_slots):
    """(first source id, first destination id, slots) of each run of blocks whose ids
    are consecutive on both sides: one strided view of each pool."""
    i = 0
    while i < len(source_ids):
        end = i + 1
        while (
            end < len(source_ids)
            and source_ids[end] == source_ids[end - 1] + 1
            and destination_ids[end] == destination_ids[end - 1] + 1
        ):
            end += 1
        yield source_ids[i], destination_ids[i], sum(filled_slots[i:end])
        i = end
