"""Shared memory for KV that moves between two workers on one host (worker.proto's
KvChunk.shm_name): the segment, its ring of chunk slots, and the handshake that decides,
per transfer, whether the destination can see it.

One segment per transfer, created by the source in /dev/shm (POSIX shared memory, as
glibc's shm_open makes it): a header page, then RING_SLOTS slots of the transfer's
largest chunk. Chunk k goes in slot k % RING_SLOTS; before the source reuses a slot it
waits until the destination has counted the chunk that was in it (the header's first
8 bytes: chunks consumed), so that at most RING_SLOTS chunks are in memory at once,
as gRPC's flow control bounded them when the bytes were in the messages.

"Same host" is not guessed from addresses: the source offers the segment's name and a
random nonce in ReceiveKv's metadata, and the destination answers "ok" only after it
mapped the segment and found the nonce in it. Another host, another container's
/dev/shm, a destination with --no-kv-transfer-shm: it answers "no: REASON" and the
chunks carry their bytes (sender.py). The destination unlinks the name as soon as it
mapped it, and the source unlinks it whenever the transfer ends: a segment lives in
/dev/shm only for the handshake, and its memory goes when both ends have unmapped it
(or died).

The space is reserved when the segment is made (posix_fallocate): a /dev/shm too small
for it (64 MiB by default in a container) refuses it there, and the transfer sends
bytes, instead of a write into a sparse page killing the worker with SIGBUS.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import struct
import threading
import time

import torch

from worker_svc.shared_kv_memory import mapping_view

SHM_DIR = "/dev/shm"
NAME_PREFIX = "cbserve-kv-"
# ReceiveKv's request metadata (the offer) and the destination's initial metadata
# (its answer) under this key.
HANDSHAKE_KEY = "cbserve-kv-shm"
ACCEPTED = "ok"
# The header: chunks consumed (uint64 little-endian) at 0, the source's nonce at 8.
HEADER_BYTES = mmap.PAGESIZE
NONCE_BYTES = 16
# Slots a transfer fills ahead of the destination: enough that the source's gather of
# one chunk overlaps the destination's write of the one before.
RING_SLOTS = 3
_NAME = re.compile(rf"^{NAME_PREFIX}[0-9a-f-]+$")
# Waiting for a free slot: a short sleep first (the destination is usually just
# finishing it), doubled up to a millisecond.
_FIRST_WAIT_S, _LONGEST_WAIT_S = 20e-6, 1e-3


class TransferEnded(Exception):
    """The transfer ended (the call failed or was cancelled) while waiting for a slot."""


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


class Segment:
    """One mapped segment: create() at the source, attach() at the destination."""

    def __init__(self, name: str, memory: mmap.mmap) -> None:
        self.name = name
        self.memory = memory

    @classmethod
    def create(cls, size: int) -> Segment:
        """A new segment of size bytes (OSError where /dev/shm has not the room)."""
        name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(segment_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.unlink(segment_path(name))
            raise
        finally:
            os.close(fd)
        return cls(name, memory)

    @classmethod
    def attach(cls, name: str, nonce: bytes) -> Segment:
        """The source's segment, mapped and then unlinked (ValueError or OSError where it
        is not a cbserve segment, not there, or not the one the source offered)."""
        if not _NAME.match(name):
            raise ValueError(f"not a cbserve KV segment name: {name!r}")
        fd = os.open(segment_path(name), os.O_RDWR)
        try:
            memory = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        segment = cls(name, memory)
        if len(memory) < HEADER_BYTES or memory[8 : 8 + NONCE_BYTES] != nonce:
            segment.close()
            raise ValueError(f"segment {name} does not hold the nonce its source offered")
        segment.unlink()
        return segment

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """nbytes of the segment as a uint8 tensor sharing its memory (close() cannot
        unmap it while the tensor lives: shared_kv_memory.mapping_view)."""
        if offset < HEADER_BYTES or offset + nbytes > len(self.memory):
            raise ValueError(
                f"bytes {offset}..{offset + nbytes} are outside segment {self.name}'s "
                f"slots ({HEADER_BYTES}..{len(self.memory)})"
            )
        return mapping_view(self.memory, nbytes, offset)

    @property
    def consumed(self) -> int:
        return struct.unpack_from("<Q", self.memory, 0)[0]

    def count_consumed(self, chunks: int) -> None:
        # After the chunk's copy has returned: the source reads this to reuse its slot.
        struct.pack_into("<Q", self.memory, 0, chunks)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # the other end did it
            os.unlink(segment_path(self.name))

    def close(self) -> None:
        # BufferError: a view still lives (a copy that was cancelled); unmapped when it goes.
        with contextlib.suppress(BufferError):
            self.memory.close()


class Ring:
    """The source's side of a segment: the slot of each chunk, and the handshake's offer."""

    def __init__(self, chunk_bytes: list[int]) -> None:
        self.num_slots = min(RING_SLOTS, len(chunk_bytes))
        self.slot_stride = _round_up(max(chunk_bytes), mmap.PAGESIZE)
        self.segment = Segment.create(HEADER_BYTES + self.num_slots * self.slot_stride)
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.segment.memory[8 : 8 + NONCE_BYTES] = self.nonce
        # Set when the call ends, so that a wait for a slot the destination will never
        # free ends with it.
        self.ended = threading.Event()

    @property
    def name(self) -> str:
        return self.segment.name

    def offer(self) -> tuple[tuple[str, str], ...]:
        return ((HANDSHAKE_KEY, f"{self.name} {self.nonce.hex()}"),)

    def slot(self, index: int, nbytes: int) -> tuple[int, torch.Tensor]:
        """Chunk index's offset and view, once the destination has consumed the chunk
        that was there before (a thread's wait: TransferEnded when the call ended)."""
        wait = _FIRST_WAIT_S
        # The second chunk waits for the first to be written, which is when the
        # destination has checked the layout: a refusal then ends the call before more
        # is written into it (a write racing the end hides the destination's status
        # behind INTERNAL, grpc/grpc#36066).
        needed = 1 if index == 1 else index - self.num_slots + 1
        while True:
            if self.ended.is_set():
                raise TransferEnded
            if self.segment.consumed >= needed:
                break
            time.sleep(wait)
            wait = min(2 * wait, _LONGEST_WAIT_S)
        offset = HEADER_BYTES + (index % self.num_slots) * self.slot_stride
        return offset, self.segment.view(offset, nbytes)

    def release(self) -> None:
        self.ended.set()
        self.segment.unlink()
        self.segment.close()


def parse_offer(value: str) -> tuple[str, bytes]:
    """An offer's segment name and nonce (ValueError where it is not one)."""
    name, nonce = value.split(" ")
    return name, bytes.fromhex(nonce)
