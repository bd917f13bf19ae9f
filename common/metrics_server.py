"""A tiny HTTP/1.1 server on the process's event loop that answers GET /metrics.

Prometheus scrapes plain HTTP; the body is prometheus-client's exposition of
the registry (common.metrics.exposition). It is rendered on the event loop,
where the values live, so a scrape sees a consistent snapshot and needs no
lock; prometheus-client's own server would read them from another thread while
the loop changes them.
Anything but GET or HEAD of /metrics gets a 404 or 405; a malformed or slow
request is dropped after a short timeout so a bad client cannot hold a
connection open.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from prometheus_client import CollectorRegistry

from common.metrics import exposition

log = structlog.get_logger("metrics")

READ_TIMEOUT_S = 5.0
MAX_HEADER_BYTES = 16 * 1024


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Starts listening; returns the bound port (useful when port was 0)."""
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=MAX_HEADER_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            # Drain the headers; only Accept (which format the scraper reads) matters.
            accept = ""
            while True:
                line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "accept":
                    accept = value.strip()
            method, path = _parse_request_line(request_line)
            content_type = "text/plain; charset=utf-8"
            if path.split("?", 1)[0] != "/metrics":
                status, body = "404 Not Found", b"only /metrics is served here\n"
            elif method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", b"use GET\n"
            else:
                status = "200 OK"
                body, content_type = exposition(self.registry, accept)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError, asyncio.LimitOverrunError) as error:
            log.debug("metrics request dropped", error=str(error))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _parse_request_line(line: bytes) -> tuple[str, str]:
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"malformed request line {line[:80]!r}")
    return parts[0], parts[1]
