"""Free TCP ports for the children a process starts, that nobody else takes first.

A port found by binding port 0 and closing the probe is free for an instant only: it
lies in the kernel's ephemeral range, so the next outgoing connection of any process
on the host, or another probe, may get the same number before the child binds it. On
a busy machine (the suite's xdist workers, each starting stacks) that happens: a
scheduler failed on a metrics port that a worker of another stack had bound, and a
scheduler reconnecting to a killed worker's port found a stranger's worker there.

So ports come from below the ephemeral range, where the kernel hands out nothing on
its own, in blocks of BLOCK_SIZE that one process claims with a lock file (flock, so
the claim ends when the process does, however it ends). Inside its blocks a process
hands each port out once; a port that is bound already (a service on the host) is
skipped. Where the host leaves no room below its ephemeral range, the old probe is
the fallback.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
from pathlib import Path

# The lowest port handed out: above the ports services commonly take (8000, 8080,
# 9090...); the top is the kernel's ephemeral range's start.
FIRST_PORT = 15_000
BLOCK_SIZE = 128
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The kernel's default ephemeral range's start, where /proc does not say.
DEFAULT_EPHEMERAL_START = 32_768


def ephemeral_start(path: Path = EPHEMERAL_RANGE) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def probe_port(host: str = "127.0.0.1") -> int:
    """A port the kernel picks (ephemeral) on `host` (IPv4 or IPv6): free now, with no
    claim on it."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class PortBlocks:
    """Hands out ports from blocks this process holds a lock on."""

    def __init__(
        self,
        first: int,
        end: int,
        lock_dir: Path,
        host: str = "127.0.0.1",
        block_size: int = BLOCK_SIZE,
    ) -> None:
        if not 0 < first <= end <= 65_536:
            raise ValueError(f"port range [{first}, {end}) is not within 1..65535")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.first, self.end, self.lock_dir, self.host = first, end, lock_dir, host
        self.block_size = block_size
        self._lock = threading.Lock()
        self._held: list[int] = []  # lock file descriptors, kept open while we live
        self._next = self._block_end = 0
        self._blocks_tried: set[int] = set()
        # A forked child inherits these blocks; it must claim its own (_default_blocks).
        self.pid = os.getpid()

    @property
    def num_blocks(self) -> int:
        return (self.end - self.first) // self.block_size

    def take(self) -> int:
        with self._lock:
            while True:
                if self._next >= self._block_end:
                    self._claim_block()
                port, self._next = self._next, self._next + 1
                if _bindable(port, self.host):
                    return port

    def _claim_block(self) -> None:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        # Start where this process's pid points, so that processes started together
        # mostly try different blocks first.
        start = os.getpid() % max(self.num_blocks, 1)
        for offset in range(self.num_blocks):
            block = (start + offset) % self.num_blocks
            if block in self._blocks_tried:
                continue
            first = self.first + block * self.block_size
            descriptor = os.open(self.lock_dir / f"{first}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(descriptor)
                continue
            self._held.append(descriptor)
            self._blocks_tried.add(block)
            self._next, self._block_end = first, first + self.block_size
            return
        raise OSError(
            f"no free block of {self.block_size} ports in [{self.first}, {self.end}): "
            f"other processes hold them all (locks in {self.lock_dir})"
        )


_blocks: PortBlocks | None = None
_blocks_lock = threading.Lock()


def _default_blocks() -> PortBlocks | None:
    global _blocks
    with _blocks_lock:
        stale = _blocks is not None and _blocks.pid != os.getpid()
        if _blocks is None or stale:
            end = min(ephemeral_start(), 65_536)
            if end - FIRST_PORT < BLOCK_SIZE:
                return None  # no room below the ephemeral range: the probe it is
            lock_dir = Path(tempfile.gettempdir()) / f"cbserve-ports-{os.getuid()}"
            _blocks = PortBlocks(FIRST_PORT, end, lock_dir)
        return _blocks


def free_port() -> int:
    """A port on 127.0.0.1 that is free and that no other process on this host gets
    from free_port, nor from the kernel, while this process lives."""
    blocks = _default_blocks()
    return probe_port() if blocks is None else blocks.take()
