"""The scheduler's end of one worker: Describe, then one Step stream.

Each plan written on the stream gets exactly one result back, in order, so a
step is a write followed by a read. A broken stream surfaces as WorkerLost;
the engine decides what happens to the requests that were on it.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from cbserve.worker.v1 import worker_pb2 as wpb
from cbserve.worker.v1 import worker_pb2_grpc as wpb_grpc
from common.grpc_options import CHANNEL_OPTIONS


class WorkerLost(Exception):
    """The worker's stream broke or it answered out of protocol."""


class WorkerClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._stub: wpb_grpc.WorkerStub | None = None
        self._stream: grpc.aio.StreamStreamCall | None = None
        self.description: wpb.WorkerDescription | None = None

    async def connect(
        self, timeout_s: float, retry_interval_s: float = 0.5
    ) -> wpb.WorkerDescription:
        """Describe the worker and open the Step stream, retrying until timeout_s."""
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while True:
            await self.close()
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._stub = wpb_grpc.WorkerStub(self._channel)
            remaining = deadline - time.monotonic()
            try:
                self.description = await self._stub.Describe(
                    wpb.DescribeRequest(),
                    timeout=max(1.0, min(5.0, remaining)),
                    wait_for_ready=True,
                )
                self._stream = self._stub.Step()
                return self.description
            except grpc.aio.AioRpcError as error:
                last_error = error
            if time.monotonic() + retry_interval_s >= deadline:
                detail = (
                    last_error.details()
                    if isinstance(last_error, grpc.aio.AioRpcError)
                    else last_error
                )
                raise WorkerLost(
                    f"worker {self.address} unreachable after {timeout_s:.0f}s: {detail}"
                ) from last_error
            await asyncio.sleep(retry_interval_s)

    async def step(self, plan: wpb.StepPlan) -> wpb.StepResult:
        if self._stream is None:
            raise WorkerLost(f"worker {self.address}: no open Step stream")
        try:
            await self._stream.write(plan)
            result = await self._stream.read()
        except grpc.aio.AioRpcError as error:
            raise WorkerLost(
                f"worker {self.address}: {error.code().name}: {error.details()}"
            ) from error
        if result is grpc.aio.EOF:
            raise WorkerLost(f"worker {self.address} closed its Step stream")
        if result.step_id != plan.step_id:
            raise WorkerLost(
                f"worker {self.address} answered step {result.step_id} to plan {plan.step_id}"
            )
        return result

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
