"""--worker-dns: the addresses behind a name become the pool's workers, with a fake resolver.

The real processes are in tests/integration/test_worker_dns.py; here a resolver
function returns whatever the test says, and a recording pool shows what
discovery asked for.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from scheduler_svc.workers.discovery import (
    WorkerDiscovery,
    dns_resolver,
    hosts_file_resolver,
    parse_target,
    worker_address,
)


class RecordingPool:
    def __init__(self) -> None:
        self.workers: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def add(self, address: str) -> None:
        self.calls.append(("add", address))
        self.workers.add(address)

    async def remove(self, address: str) -> None:
        self.calls.append(("remove", address))
        self.workers.discard(address)


class FakeResolver:
    """Answers with `ips`, or raises `error`; records the names asked for."""

    def __init__(self) -> None:
        self.ips: list[str] = []
        self.error: Exception | None = None
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if self.error is not None:
            raise self.error
        return list(self.ips)


def _discovery(resolver, pool=None) -> tuple[WorkerDiscovery, RecordingPool]:
    pool = pool or RecordingPool()
    return WorkerDiscovery("workers.test:50061", pool, 0.01, resolver), pool


def test_new_addresses_are_added_and_vanished_ones_removed():
    resolver = FakeResolver()
    discovery, pool = _discovery(resolver)

    async def scenario():
        resolver.ips = ["10.0.0.1", "10.0.0.2"]
        await discovery.refresh()
        assert pool.workers == {"10.0.0.1:50061", "10.0.0.2:50061"}
        resolver.ips = ["10.0.0.2", "10.0.0.3"]
        await discovery.refresh()
        assert pool.workers == {"10.0.0.2:50061", "10.0.0.3:50061"}
        # An unchanged answer changes nothing.
        before = len(pool.calls)
        await discovery.refresh()
        assert len(pool.calls) == before

    asyncio.run(scenario())
    assert resolver.asked[0] == ("workers.test", 50061)
    assert ("remove", "10.0.0.1:50061") in pool.calls
    assert pool.calls.count(("add", "10.0.0.2:50061")) == 1


def test_a_name_without_addresses_removes_every_worker():
    resolver = FakeResolver()
    discovery, pool = _discovery(resolver)

    async def scenario():
        resolver.ips = ["10.0.0.1"]
        await discovery.refresh()
        resolver.ips = []
        await discovery.refresh()

    asyncio.run(scenario())
    assert pool.workers == set()


@pytest.mark.parametrize("error", [OSError("server timed out"), socket.gaierror(-3, "again")])
def test_a_failed_lookup_keeps_the_workers(error):
    resolver = FakeResolver()
    discovery, pool = _discovery(resolver)

    async def scenario():
        resolver.ips = ["10.0.0.1"]
        await discovery.refresh()
        resolver.error = error
        await discovery.refresh()

    asyncio.run(scenario())
    assert pool.workers == {"10.0.0.1:50061"}


def test_a_lookup_slower_than_the_interval_keeps_the_workers():
    async def slow(host: str, port: int) -> list[str]:
        await asyncio.sleep(10)
        return []

    pool = RecordingPool()
    pool.workers.add("kept")
    discovery = WorkerDiscovery("workers.test:50061", pool, 0.01, slow)
    discovery.interval_s = 0.0  # the timeout is at least one second
    asyncio.run(discovery.refresh())
    assert pool.calls == []


def test_following_picks_up_changes_until_stopped():
    resolver = FakeResolver()
    discovery, pool = _discovery(resolver)

    async def scenario():
        discovery.start()
        resolver.ips = ["10.0.0.7"]
        for _ in range(200):
            if pool.workers:
                break
            await asyncio.sleep(0.01)
        await discovery.stop()

    asyncio.run(scenario())
    assert pool.workers == {"10.0.0.7:50061"}


def test_ipv6_addresses_are_dialled_in_brackets():
    assert worker_address("fd00::1", 50061) == "[fd00::1]:50061"
    assert worker_address("10.1.2.3", 50061) == "10.1.2.3:50061"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            "cbserve-worker.ns.svc.cluster.local:50061",
            ("cbserve-worker.ns.svc.cluster.local", 50061),
        ),
        ("[fd00::1]:7", ("fd00::1", 7)),
    ],
)
def test_targets_parse(target, expected):
    assert parse_target(target) == expected


@pytest.mark.parametrize("target", ["name", "name:", ":50061", "name:http", "name:70000"])
def test_bad_targets_are_refused(target):
    with pytest.raises(ValueError, match="NAME:PORT"):
        parse_target(target)


def test_hosts_file_resolver_rereads_its_file(tmp_path):
    path = tmp_path / "hosts"
    resolve = hosts_file_resolver(path)
    assert asyncio.run(resolve("workers.test", 1)) == []  # no file yet
    path.write_text(
        "# comment\n127.0.0.2 workers.test other\n127.0.0.1 workers.test  # trailing\n"
        "127.0.0.3 unrelated\n"
    )
    assert asyncio.run(resolve("workers.test", 1)) == ["127.0.0.1", "127.0.0.2"]
    path.write_text("127.0.0.3 workers.test\n")
    assert asyncio.run(resolve("workers.test", 1)) == ["127.0.0.3"]


def test_dns_resolver_uses_the_system_resolver():
    assert "127.0.0.1" in asyncio.run(dns_resolver("localhost", 50061))


@pytest.mark.parametrize(
    ("errno", "no_workers"),
    [(socket.EAI_NONAME, True), (socket.EAI_AGAIN, False), (socket.EAI_FAIL, False)],
)
def test_dns_resolver_tells_no_address_from_a_failed_lookup(monkeypatch, errno, no_workers):
    async def getaddrinfo(self, *args, **kwargs):
        raise socket.gaierror(errno, "fake")

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    if no_workers:
        assert asyncio.run(dns_resolver("cbserve-worker.test", 50061)) == []
    else:
        with pytest.raises(OSError):
            asyncio.run(dns_resolver("cbserve-worker.test", 50061))
