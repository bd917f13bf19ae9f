"""A KV transfer whose source worker is lost mid-way (issue 46): the engine's recovery
closes the worker's channel, which cancels its calls; a SendKv in flight must fail
as an error the move recomputes on (UNAVAILABLE), not as a CancelledError that ends
the move, the drain and the client's stream with it."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.workers.client import WorkerClient

from .grpc_fake_worker import GrpcFakeWorker


class HangingSendKv(GrpcFakeWorker):
    """Its SendKv never answers: a transfer under way when the worker is lost."""

    async def SendKv(self, request, context):  # noqa: N802 (gRPC method name)
        await asyncio.sleep(60)


async def _send_under_way() -> tuple[HangingSendKv, WorkerClient, asyncio.Task]:
    """A worker whose SendKv hangs, a client to it, and a send_kv call under way."""
    worker = await HangingSendKv().start()
    client = WorkerClient(worker.address)
    await client.connect(5.0)
    send = asyncio.create_task(client.send_kv(1, "127.0.0.1:1", [0], [0], 4, 30.0))
    await asyncio.sleep(0.2)
    return worker, client, send


def test_a_send_kv_cut_by_the_channel_closing_fails_unavailable():
    async def scenario():
        worker, client, send = await _send_under_way()
        await client.close()  # what the engine's recovery does
        with pytest.raises(ServiceError) as caught:
            await asyncio.wait_for(send, 5.0)
        assert caught.value.code is grpc.StatusCode.UNAVAILABLE
        await worker.stop()

    asyncio.run(scenario())


def test_a_cancel_of_the_caller_is_still_a_cancel():
    async def scenario():
        worker, client, send = await _send_under_way()
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        await client.close()
        await worker.stop()

    asyncio.run(scenario())
