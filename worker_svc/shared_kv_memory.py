"""The CPU KV pool in shared memory, so that a worker on this host copies moved blocks
straight out of it (kv_transfer/pool_read.py): one copy, where the ring of shm.py takes
two (a gather into a slot, a scatter out of it).

The memory is an anonymous memfd (memfd_create): shmem with no name in /dev/shm, so a
container's 64 MiB /dev/shm does not limit it and a worker that dies leaves nothing
behind. Another process opens it as /proc/PID/fd/FD, which the kernel allows to the
same user in the same pid namespace (another container, another user: refused, and the
transfer falls back). The file is the pool's bytes, then one trailer page holding a
random nonce: the source offers "PID FD BYTES NONCE", and only a process that mapped
this very memory can read the nonce back, so "same host" is proven, not guessed.

Huge pages: shmem gets them only where /sys/kernel/mm/transparent_hugepage/shmem_enabled
(or its 2 MiB size's own setting) allows madvise's request (advise, always,
within_size, force); on "never", the usual default, the shared pool is on 4 KiB pages,
where the private one gets 2 MiB pages (huge_pages.py). bench/micro/shared_pool_ab.py
measures what that costs a decode's attention; --kv-pool-shared is the choice.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import warnings
from pathlib import Path

import numpy as np
import torch

from worker_svc.huge_pages import advise_huge_pages

NONCE_BYTES = 16
TRAILER_BYTES = mmap.PAGESIZE
_THP = Path("/sys/kernel/mm/transparent_hugepage")
_HUGE_ON_ADVICE = ("always", "within_size", "advise", "force")


def _selected(path: Path) -> str:
    """The bracketed choice of a sysfs THP setting ("" where the file is absent)."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else ""


def shared_pool_available() -> bool:
    """Whether this OS has memfd_create (Linux; not macOS, where the pool stays private)."""
    return hasattr(os, "memfd_create")


def shmem_huge_pages_allowed() -> bool:
    """Whether madvise(MADV_HUGEPAGE) on shmem gets 2 MiB pages on this kernel."""
    own = _selected(_THP / "hugepages-2048kB" / "shmem_enabled")
    chosen = _selected(_THP / "shmem_enabled") if own in ("", "inherit") else own
    return chosen in _HUGE_ON_ADVICE


def mapping_view(memory: mmap.mmap, nbytes: int, offset: int = 0) -> torch.Tensor:
    """nbytes of a mapping from offset, as a uint8 tensor sharing its memory. Through
    numpy, whose array holds the mapping's buffer: the mapping cannot be closed under a
    live tensor (torch.frombuffer holds no such export)."""
    return torch.from_numpy(np.frombuffer(memory, np.uint8, nbytes, offset))


def _as_tensor(memory: mmap.mmap, nbytes: int, shape, dtype: torch.dtype) -> torch.Tensor:
    return mapping_view(memory, nbytes).view(dtype).view(shape)


class SharedPoolMemory:
    """The source's side: the memfd, its mapping and the nonce in its trailer."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.fd = os.memfd_create("cbserve-kv-pool", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, nbytes + TRAILER_BYTES)
            self.memory = mmap.mmap(self.fd, nbytes + TRAILER_BYTES, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.memory[nbytes : nbytes + NONCE_BYTES] = self.nonce

    def tensor(self, shape, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
        """The pool's tensor over the memory, advised onto huge pages before its first
        write, and whether it will get them."""
        tensor = _as_tensor(self.memory, self.nbytes, shape, dtype)
        advised = advise_huge_pages(tensor)
        return tensor, advised and shmem_huge_pages_allowed()

    def offer(self) -> str:
        return f"{os.getpid()} {self.fd} {self.nbytes} {self.nonce.hex()}"


class MappedSourcePool:
    """The destination's side: another worker's pool memory, mapped read-only."""

    def __init__(self, memory: mmap.mmap, nbytes: int, path: str, inode: tuple[int, int]):
        self.memory = memory
        self.nbytes = nbytes
        self.path, self.inode = path, inode

    @classmethod
    def attach(cls, offer: str, proc: str = "/proc") -> MappedSourcePool:
        """The offered pool, mapped (OSError where it cannot be opened: another
        container or user; ValueError where the offer is malformed or the memory
        opened does not hold the offered nonce)."""
        pid, fd, nbytes, nonce = offer.split(" ")
        nbytes_int, nonce_bytes = int(nbytes), bytes.fromhex(nonce)
        if nbytes_int <= 0 or len(nonce_bytes) != NONCE_BYTES:
            raise ValueError(f"not a KV pool offer: {offer!r}")
        path = f"{proc}/{int(pid)}/fd/{int(fd)}"
        opened = os.open(path, os.O_RDONLY)
        try:
            stat = os.fstat(opened)
            size, inode = stat.st_size, (stat.st_dev, stat.st_ino)
            if size != nbytes_int + TRAILER_BYTES:
                raise ValueError(f"the memory opened is {size} bytes, not the offered pool's")
            memory = mmap.mmap(opened, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(opened)
        mapped = cls(memory, nbytes_int, path, inode)
        if memory[nbytes_int : nbytes_int + NONCE_BYTES] != nonce_bytes:
            mapped.close()
            raise ValueError("the memory opened does not hold the nonce its source offered")
        return mapped

    def tensor(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """The source's pool as a tensor of the given shape (ValueError where the shape
        does not fill the mapped pool's bytes). Read-only: never written."""
        element = torch.empty((), dtype=dtype).element_size()
        if int(np.prod(shape)) * element != self.nbytes:
            raise ValueError(f"a pool of shape {tuple(shape)} is not {self.nbytes} bytes")
        # A read-only buffer, of which torch warns; it is only ever a copy's source.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return _as_tensor(self.memory, self.nbytes, shape, dtype)

    def source_alive(self) -> bool:
        """Whether the source still holds this memory at the offered /proc/PID/fd/FD: a
        source that died (or a pid reused) does not."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == self.inode

    def close(self) -> None:
        # BufferError: a view still lives (a copy that was cancelled); unmapped when it goes.
        with contextlib.suppress(BufferError):
            self.memory.close()
