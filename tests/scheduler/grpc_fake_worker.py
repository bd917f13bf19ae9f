"""The FakeWorker behind a real gRPC server on loopback, with faults on demand.

For the scheduler's own liveness logic (client, engine, pool) without a model:
each Step stream gets a fresh FakeWorker (a new stream resets a worker), and
the test can delay or withhold results, answer the wrong step, or stop the
server as a dying process would. Every result carries its stream's number in
`num_tokens`, so that a test can see which stream an answer came from.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cbserve.worker.v1 import worker_pb2 as wpb
from cbserve.worker.v1 import worker_pb2_grpc as wpb_grpc
from common.grpc_options import SERVER_OPTIONS
from scheduler_svc.workers.shutdown_watch import WORKER_SERVICE

from .fake_worker import FakeWorker
from .harness import THE
from .kv_transfer_fakes import FAKE_BYTES_PER_TOKEN, copy_kv

NUM_BLOCKS = 64
BLOCK_SIZE = 4


class GrpcFakeWorker(wpb_grpc.WorkerServicer):
    def __init__(self) -> None:
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.streams = 0
        # Seconds to hold every result back (a slow or hung forward pass).
        self.delay_s = 0.0
        # Added to every answered step id (an out-of-protocol worker).
        self.step_id_offset = 0
        # The current stream's fake worker (its KV pool), and the workers SendKv may
        # reach by address (tests share one dict between them).
        self.worker: FakeWorker | None = None
        self.peers: dict[str, GrpcFakeWorker] = {}
        # SendKv fails with this status (None: it copies the blocks, kv_transfer_fakes).
        self.send_kv_fails: grpc.StatusCode | None = None
        self.transfers = 0
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> GrpcFakeWorker:
        """Starts serving; again after stop() (on the same port), a restarted worker."""
        # A stopped server must be collected while the event loop still runs.
        self.server = None
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        wpb_grpc.add_WorkerServicer_to_server(self, self.server)
        # grpc.health.v1, as a real worker serves it (SIGTERM: NOT_SERVING, shutting_down).
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.starts += 1  # a restarted worker is another instance, as a real one is
        await self.server.start()
        await self.health.set(WORKER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        return self

    async def shutting_down(self) -> None:
        """What a real worker does first on SIGTERM: NOT_SERVING, its streams still open."""
        await self.health.enter_graceful_shutdown()

    async def stop(self) -> None:
        """Goes away as a killed process does: every open stream breaks."""
        await self.server.stop(grace=None)

    async def Describe(self, request, context):  # noqa: N802 (gRPC method name)
        return wpb.WorkerDescription(
            model_name="fake",
            num_kv_blocks=NUM_BLOCKS,
            block_size=BLOCK_SIZE,
            max_model_len=256,
            vocab_size=49152,
            instance_id=f"fake-{self.port}-{self.starts}",
        )

    async def Step(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self.streams += 1
        stream = self.streams
        worker = self.worker = FakeWorker(NUM_BLOCKS, BLOCK_SIZE, lambda *_: THE)
        async for plan in request_iterator:
            result = worker.step_proto(plan)
            result.step_id += self.step_id_offset
            result.num_tokens = stream
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield result

    async def SendKv(self, request, context):  # noqa: N802 (gRPC method name)
        """The source's end of a transfer, the destination's ReceiveKv played in process."""
        self.transfers += 1
        await asyncio.sleep(0.01)  # the wire: steps of both workers go on meanwhile
        if self.send_kv_fails is not None:
            await context.abort(self.send_kv_fails, "the fake transfer failed")
        copy_kv(
            self.worker,
            self.peers[request.destination].worker,
            request.source_block_ids,
            request.destination_block_ids,
            request.num_tokens,
        )
        return wpb.SendKvReply(bytes_sent=request.num_tokens * FAKE_BYTES_PER_TOKEN, num_chunks=1)
