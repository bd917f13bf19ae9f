"""A TCP proxy on loopback that can stop forwarding without closing anything.

What a node that drops off the network looks like to the scheduler: no FIN, no
RST, the connection stays open, and nothing comes back, not even to an HTTP/2
ping. cut() holds every byte read from then on (both ways, on every
connection, new ones included); heal() forwards again. The proxy runs its own
asyncio loop on a thread, so that the blocking test code can drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class BlackholeProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._forwarding: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> BlackholeProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._forwarding = asyncio.Event()
        self._forwarding.set()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.host, self.upstream_port
            )
        except OSError:
            client_writer.close()
            return
        for reader, writer in (
            (client_reader, upstream_writer),
            (upstream_reader, client_writer),
        ):
            task = asyncio.create_task(self._pipe(reader, writer))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._forwarding.wait()
                data = await reader.read(65536)
                if not data:
                    break
                # Bytes read just before a cut are held too, not delivered.
                await self._forwarding.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def _set_forwarding(self, forwarding: bool) -> None:
        if forwarding:
            self._forwarding.set()
        else:
            self._forwarding.clear()

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._set_forwarding, False)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._set_forwarding, True)

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for task in list(self._pipes):
                task.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
