"""common.health_probe against a real server built the way both processes build theirs.

The server is common.grpc_server.create_server on a grpc.aio event loop in a thread of
its own, so that the probe (plain synchronous gRPC, as it runs in a container) can be
called from the test body, and as `python -m common.health_probe` in a subprocess.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cbserve.ports import free_port
from common.grpc_server import create_server, set_serving
from common.health_probe import EXIT_SERVING, EXIT_UNHEALTHY, check, main

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVICE = "cbserve.v1.Generation"


class HealthServer:
    """A grpc.aio server with only the health service, driven from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, self.health, port = self.call(self._start())
        self.address = f"127.0.0.1:{port}"

    async def _start(self):
        server, health, port = create_server("127.0.0.1:0")
        await server.start()
        return server, health, port

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)

    def set_serving(self, serving: bool) -> None:
        self.call(set_serving(self.health, [SERVICE], serving))

    def close(self) -> None:
        self.call(self.server.stop(grace=None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def server():
    server = HealthServer()
    yield server
    server.close()


def test_serving_server_exits_zero(server, capsys):
    server.set_serving(True)
    assert main([server.address]) == EXIT_SERVING
    assert "SERVING" in capsys.readouterr().out
    assert main([server.address, "--service", SERVICE, "--quiet"]) == EXIT_SERVING
    assert capsys.readouterr().out == ""


def test_not_serving_exits_one_and_says_why(server, capsys):
    server.set_serving(False)
    assert main([server.address]) == EXIT_UNHEALTHY
    assert "NOT_SERVING" in capsys.readouterr().err
    assert main([server.address, "--service", SERVICE]) == EXIT_UNHEALTHY


def test_probe_follows_status_changes(server):
    # A health check is asked again and again; each answer must be the current one.
    for serving in (False, True, False, True):
        server.set_serving(serving)
        assert check(server.address)[0] is serving


def test_unknown_service_is_unhealthy(server, capsys):
    server.set_serving(True)
    assert main([server.address, "--service", "no.such.Service"]) == EXIT_UNHEALTHY
    assert "unknown service" in capsys.readouterr().err


def test_nothing_listening_is_unhealthy_and_fast(capsys):
    started = time.monotonic()
    assert main([f"127.0.0.1:{free_port()}", "--timeout", "5"]) == EXIT_UNHEALTHY
    assert time.monotonic() - started < 5, "the probe waited for a server that is not there"
    assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.process
def test_module_entry_point_as_compose_runs_it(server):
    # The exact form docker-compose.yml's healthcheck uses.
    probe = [sys.executable, "-m", "common.health_probe"]
    server.set_serving(True)
    serving = subprocess.run(
        [*probe, server.address], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert serving.returncode == 0, serving.stderr
    server.set_serving(False)
    not_serving = subprocess.run(
        [*probe, server.address], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert not_serving.returncode == 1
    assert "NOT_SERVING" in not_serving.stderr
