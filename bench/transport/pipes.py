"""Byte pipes between two processes on one host, for bench.transport.measure.

Each transport is a receiving end, which listens at an address and yields payloads
(an empty one is the sender's end mark), and a sending end, which connects and sends.
Every send waits only where the transport pushes back (a full buffer), so a sender that
outruns its receiver slows to it instead of queueing without end.

- `stream`: an asyncio Unix-domain stream (uvloop's), 4-byte length-prefixed frames;
- `zmq`: ZeroMQ PUSH/PULL over ipc:// with zmq.asyncio (its own I/O thread per context);
- `grpc`: grpc.aio over a unix: socket, one client stream of bytes messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Protocol

import grpc
import zmq
import zmq.asyncio

FRAME_HEADER = struct.Struct("<I")
GRPC_METHOD = "/cbserve.ipc.Pipe/Send"


class Receiver(Protocol):
    async def open(self, path: str) -> None: ...
    async def recv(self) -> bytes | memoryview: ...
    async def close(self) -> None: ...


class Sender(Protocol):
    async def open(self, path: str) -> None: ...
    async def send(self, payload: bytes) -> None: ...
    async def close(self) -> None: ...


class StreamReceiver:
    async def open(self, path: str) -> None:
        self._connected: asyncio.Future = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_unix_server(self._accept, path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._connected.set_result(reader)

    async def recv(self) -> bytes:
        reader = await self._connected
        (size,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
        return await reader.readexactly(size)

    async def close(self) -> None:
        self._server.close()


class StreamSender:
    async def open(self, path: str) -> None:
        _, self._writer = await asyncio.open_unix_connection(path)

    async def send(self, payload: bytes) -> None:
        self._writer.write(FRAME_HEADER.pack(len(payload)) + payload)
        await self._writer.drain()  # returns at once below the buffer's high-water mark

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


class ZmqReceiver:
    async def open(self, path: str) -> None:
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.bind(f"ipc://{path}")

    async def recv(self) -> memoryview:
        frame = await self._socket.recv(copy=False)
        return frame.buffer

    async def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


class ZmqSender:
    async def open(self, path: str) -> None:
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.connect(f"ipc://{path}")

    async def send(self, payload: bytes) -> None:
        await self._socket.send(payload)

    async def close(self) -> None:
        self._socket.close(linger=1000)
        self._context.term()


class GrpcReceiver:
    async def open(self, path: str) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        handler = grpc.method_handlers_generic_handler(
            "cbserve.ipc.Pipe", {"Send": grpc.stream_unary_rpc_method_handler(self._pipe)}
        )
        self._server = grpc.aio.server(handlers=[handler])
        self._server.add_insecure_port(f"unix:{path}")
        await self._server.start()

    async def _pipe(self, requests, context) -> bytes:
        async for payload in requests:
            self._queue.put_nowait(payload)
        return b""

    async def recv(self) -> bytes:
        return await self._queue.get()

    async def close(self) -> None:
        await self._server.stop(grace=1.0)  # lets the sender end its call


class GrpcSender:
    async def open(self, path: str) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{path}")
        self._call = self._channel.stream_unary(GRPC_METHOD)()

    async def send(self, payload: bytes) -> None:
        await self._call.write(payload)

    async def close(self) -> None:
        await self._call.done_writing()
        # The receiver may have stopped its server already, once it saw the end mark.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._call
        await self._channel.close()


TRANSPORTS: dict[str, tuple[type, type]] = {
    "stream": (StreamSender, StreamReceiver),
    "zmq": (ZmqSender, ZmqReceiver),
    "grpc": (GrpcSender, GrpcReceiver),
}
