"""The HTTP front on the scheduler's event loop: uvicorn served as a task beside gRPC.

Started after the gRPC server, stopped after the drain (which already ended or cut
every request, so stopping only closes connections). uvicorn's logging config,
lifespan and signal handling are left out: the process's structlog setup and its
own SIGTERM handler (drain, then stop) stay in charge. So the socket is bound
here and uvicorn's startup/main_loop/shutdown are driven directly, rather than
through Server.serve(), which installs signal handlers and exits the process
when the port is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

from scheduler_svc.api.api_keys import ApiKeys
from scheduler_svc.api.http.app import create_app
from scheduler_svc.api.server import GenerationService
from scheduler_svc.config.edge import EdgeConfig

# Connections a client keeps open without a request are closed after this long.
KEEP_ALIVE_S = 30
# After the drain no request is left: what remains is closing idle connections.
GRACEFUL_SHUTDOWN_S = 2


def _listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Raises OSError (the port taken, an unknown host)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            # API processes share the port; the kernel spreads connections over them.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class HttpFront:
    def __init__(
        self, service: GenerationService, edge: EdgeConfig, host: str, reuse_port: bool = False
    ) -> None:
        config = uvicorn.Config(
            create_app(service, ApiKeys(edge.api_key)),
            host=host,
            port=edge.http_port,
            ssl_certfile=edge.tls_cert,
            ssl_keyfile=edge.tls_key,
            log_config=None,
            access_log=False,
            lifespan="off",
            loop="none",
            http="httptools",
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        self.host = host
        self.port = edge.http_port
        self.reuse_port = reuse_port
        self.scheme = "https" if edge.tls else "http"
        self._server = uvicorn.Server(config)
        self._sockets: list[socket.socket] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Listens; raises OSError for a port taken, ssl.SSLError or OSError for a
        certificate or key that cannot be loaded."""
        config = self._server.config
        config.load()  # loads the TLS certificate and key
        # What Server.serve() sets before its startup (lifespan is off: a no-op).
        self._server.lifespan = config.lifespan_class(config)
        self._sockets = [_listening_socket(self.host, self.port, self.reuse_port)]
        await self._server.startup(sockets=self._sockets)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        await self._server.main_loop()
        await self._server.shutdown(sockets=self._sockets)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
