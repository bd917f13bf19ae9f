"""Following the workers behind a DNS name (--worker-dns NAME:PORT).

A Kubernetes headless Service answers one A/AAAA record per ready pod, so one
name stands for every worker. Every --worker-dns-interval seconds the name is
resolved again: an address that appears becomes a worker in the pool, one
that disappears is removed (pod deleted, scaled down, or failing readiness).

The resolver is a plain async function (host, port) -> IP strings, so that
tests, and hosts without a DNS server, can swap it: hosts_file_resolver reads
a hosts-format file instead (--worker-hosts-file). A name that does not exist
or has no address means "no workers now"; any other lookup error (a DNS
server timing out) keeps the current set, so a DNS hiccup never drops a
healthy worker with its requests.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from common.addresses import parse_target
from common.cancel_safe import cancel_and_wait, done_within

if TYPE_CHECKING:
    from scheduler_svc.workers.pool import WorkerPool

log = structlog.get_logger("scheduler.discovery")

Resolver = Callable[[str, int], Awaitable[list[str]]]

# getaddrinfo's answers for "this name has no address", as opposed to "ask later".
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def worker_address(ip: str, port: int) -> str:
    """The host:port the scheduler dials (gRPC wants IPv6 in brackets)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def dns_resolver(host: str, port: int) -> list[str]:
    """Every A and AAAA address of host, through the system resolver, off the event loop."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno in _NO_ADDRESS:
            return []
        raise
    return sorted({info[4][0] for info in infos})


def hosts_file_resolver(path: str | Path) -> Resolver:
    """A resolver reading `IP NAME [NAME ...]` lines (the /etc/hosts format) from path,
    re-read at every lookup; a missing file has no names."""

    async def resolve(host: str, port: int) -> list[str]:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return []
        found = set()
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and host in fields[1:]:
                found.add(fields[0])
        return sorted(found)

    return resolve


class WorkerDiscovery:
    def __init__(
        self,
        target: str,
        pool: WorkerPool,
        interval_s: float = 5.0,
        resolver: Resolver = dns_resolver,
    ) -> None:
        self.host, self.port = parse_target(target)
        self.target = target
        self.pool = pool
        self.interval_s = interval_s
        self.resolver = resolver
        # The addresses of the last successful lookup: the workers this name added.
        self.addresses: set[str] = set()
        self._task: asyncio.Task | None = None

    async def refresh(self) -> None:
        """One lookup; adds the new addresses to the pool and removes the vanished ones."""
        try:
            # A lookup slower than the interval is as good as failed: try again then.
            ips = await self._resolve(max(self.interval_s, 1.0))
        except (OSError, TimeoutError) as error:
            log.warning(
                "worker lookup failed; keeping the workers", name=self.target, error=str(error)
            )
            return
        found = {worker_address(ip, self.port) for ip in ips}
        for address in sorted(found - self.addresses):
            log.info("worker appeared", name=self.target, worker=address)
            self.pool.add(address)
        for address in sorted(self.addresses - found):
            log.info("worker disappeared", name=self.target, worker=address)
            await self.pool.remove(address)
        self.addresses = found

    async def _resolve(self, timeout_s: float) -> list[str]:
        """The resolver's answer, or TimeoutError; not wait_for, which on Python 3.10
        and 3.11 can lose stop()'s cancel (common.cancel_safe)."""
        lookup = asyncio.ensure_future(self.resolver(self.host, self.port))
        try:
            if not await done_within(lookup, timeout_s):
                raise TimeoutError(f"no answer within {timeout_s:.3g} s")
            return lookup.result()
        finally:
            lookup.cancel()

    def start(self) -> None:
        """Follows the name until stop(); the first lookup is immediate."""
        self._task = asyncio.create_task(self._follow(), name=f"discovery {self.target}")

    async def _follow(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                # A bug here must not stop the following for good.
                log.exception("worker lookup crashed", name=self.target)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
