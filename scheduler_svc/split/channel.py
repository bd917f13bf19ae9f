"""Framed messages between the core and an API process, over a Unix-domain socket.

A frame is a 4-byte little-endian length and a pickle. Both ends are processes of one
deployment started from one code tree, so pickle's reach into any type is a feature
here (a Request or a ServiceError crosses as itself), not an attack surface: the socket
lives in a directory only this user can enter.

Sends never wait: a frame is handed to the event loop's transport, which writes what
the peer takes and buffers the rest, so the core's step loop is never held by a slow
API process (its buffer grows instead; it is bounded by the requests in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct

_LENGTH = struct.Struct("<I")
# A frame above this is a bug on the other side, not traffic: refuse it, do not allocate.
MAX_FRAME_BYTES = 256 * 1024 * 1024


class ChannelClosed(Exception):
    """The other end closed the socket or exited."""


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, message: object) -> None:
        if self._writer.is_closing():
            raise ChannelClosed("the channel is closed")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._writer.write(_LENGTH.pack(len(payload)) + payload)

    async def recv(self) -> object:
        try:
            header = await self._reader.readexactly(_LENGTH.size)
            (length,) = _LENGTH.unpack(header)
            if length > MAX_FRAME_BYTES:
                raise ChannelClosed(f"a frame of {length} bytes is over the limit")
            return pickle.loads(await self._reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            raise ChannelClosed(str(error) or "the other end closed the channel") from error

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


async def connect(path: str) -> Channel:
    reader, writer = await asyncio.open_unix_connection(path, limit=MAX_FRAME_BYTES)
    return Channel(reader, writer)


async def serve(path: str, on_channel) -> asyncio.AbstractServer:
    """Listens on path; on_channel(channel) is started as a task for each connection."""

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await on_channel(Channel(reader, writer))

    return await asyncio.start_unix_server(accepted, path, limit=MAX_FRAME_BYTES)
