"""The scheduler's end of one worker: Describe, then one Step stream at a time.

Each plan written on the stream gets exactly one result back, in order (with
async scheduling a second plan is written while the worker runs the first). A
reader task reads the stream for as long as it is open, so that a stream
that breaks while nothing is in flight (an idle worker killed, one that never
got a request) is noticed at once, not at the next write; a step waits for
the reader to hand it its result, within the step's deadline. The channel
sends keepalive pings (common.grpc_options), which end the stream of a worker
that stopped answering: stopped, or unreachable. With a ChannelSecurity the
channel is TLS (mutual, when it carries a client certificate), on every
connect and reconnect alike.

The first sign of a lost worker wins and is reported once (on_lost, then
WorkerLost from every call) with its cause (liveness.LossCause). Every stream
has an epoch: once the scheduler gives a stream up, nothing read from it any
more reaches a step, so a hung worker that wakes up cannot deliver stale
results; the engine reconnects with a new stream, which resets the worker.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import grpc

from cbserve.worker.v1 import worker_pb2 as wpb
from cbserve.worker.v1 import worker_pb2_grpc as wpb_grpc
from common.cancel_safe import done_within
from common.errors import ServiceError
from common.grpc_options import channel_options
from common.tls import ChannelSecurity, open_channel
from scheduler_svc.core.plan import DeferredMasks, StepOutput, StepPlan
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.workers.codec import deferred_masks_to_proto, output_from_proto, plan_to_proto
from scheduler_svc.workers.liveness import (
    LossCause,
    WorkerLost,
    cause_of,
    reconnect_channel_options,
)

__all__ = ["WorkerClient", "WorkerLost"]

# A LoadAdapter reads an adapter's files: seconds at most for the few megabytes of one.
ADAPTER_CALL_TIMEOUT_S = 60.0


class WorkerClient:
    def __init__(
        self,
        address: str,
        keepalive_timeout_s: float = 10.0,
        on_lost: Callable[[WorkerLost], None] | None = None,
        security: ChannelSecurity | None = None,
    ) -> None:
        self.address = address
        # TLS to the worker (the scheduler's --worker-tls-*); None: plaintext.
        self.security = security
        self.keepalive_timeout_s = keepalive_timeout_s
        # Called once per stream, from the reader or a step, when the worker is lost.
        self.on_lost = on_lost
        self._channel: grpc.aio.Channel | None = None
        self._stub: wpb_grpc.WorkerStub | None = None
        self._stream: grpc.aio.StreamStreamCall | None = None
        self._reader: asyncio.Task | None = None
        self.description: wpb.WorkerDescription | None = None
        # Counts the streams opened; results are taken only from the current one.
        self.epoch = 0
        # Steps sent and not answered, oldest first: (step id, future the reader
        # completes). Two with async scheduling: the worker runs one, the next waits.
        self._waiting: deque[tuple[int, asyncio.Future[wpb.StepResult]]] = deque()
        # Why the current stream is lost (None while it is fine).
        self.lost: WorkerLost | None = None

    @property
    def channel(self) -> grpc.aio.Channel | None:
        """The current connection's channel (None before connect and after close)."""
        return self._channel

    async def connect(self, timeout_s: float) -> wpb.WorkerDescription:
        """One connect attempt: Describe the worker and open the Step stream, waiting
        up to timeout_s for it to answer (the channel retries with its reconnect
        backoff meanwhile); raises WorkerLost. Retrying attempts is keep_trying's."""
        await self.close()
        options = [*channel_options(self.keepalive_timeout_s), *reconnect_channel_options()]
        self._channel = open_channel(self.address, self.security, options)
        self._stub = wpb_grpc.WorkerStub(self._channel)
        try:
            self.description = await self._stub.Describe(
                wpb.DescribeRequest(), timeout=timeout_s, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as error:
            # wait_for_ready waits out a worker that is not listening yet; any other
            # status is the worker's own answer (UNAVAILABLE while it loads its model).
            if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                reason = f"unreachable for {timeout_s:g}s"
            else:
                reason = f"answered {error.code().name}"
            raise WorkerLost(f"worker {self.address} {reason}: {error.details()}") from error
        self._open_stream()
        return self.description

    def _open_stream(self) -> None:
        self.epoch += 1
        self.lost = None
        self._stream = self._stub.Step()
        self._reader = asyncio.create_task(
            self._read(self.epoch, self._stream), name=f"read {self.address} #{self.epoch}"
        )

    async def _read(self, epoch: int, stream: grpc.aio.StreamStreamCall) -> None:
        while True:
            try:
                result = await stream.read()
            except grpc.aio.AioRpcError as error:
                self._lose(epoch, self._rpc_lost(error))
                return
            if result is grpc.aio.EOF:
                self._lose(epoch, WorkerLost(f"worker {self.address} closed its Step stream"))
                return
            if epoch != self.epoch:
                return  # a stream given up: whatever it says is stale
            if not self._waiting or self._waiting[0][0] != result.step_id:
                asked = f"step {self._waiting[0][0]}" if self._waiting else "no step"
                self._lose(
                    epoch,
                    WorkerLost(
                        f"worker {self.address} answered step {result.step_id} to {asked}",
                        LossCause.PROTOCOL,
                    ),
                )
                return
            _, answer = self._waiting.popleft()
            if not answer.done():
                answer.set_result(result)

    def _rpc_lost(self, error: grpc.aio.AioRpcError) -> WorkerLost:
        return WorkerLost(
            f"worker {self.address}: {error.code().name}: {error.details()}", cause_of(error)
        )

    def _lose(self, epoch: int, error: WorkerLost) -> None:
        """Marks the stream of `epoch` lost, once; fails the step waiting on it."""
        if epoch != self.epoch or self.lost is not None:
            return
        self.lost = error
        for _, answer in self._waiting:
            if not answer.done():
                answer.set_exception(error)
                # Retrieved or not (a step never awaited), it must not be logged as lost.
                answer.exception()
        self._waiting.clear()
        if self.on_lost is not None:
            self.on_lost(error)

    def raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self._stream is None:
            raise WorkerLost(f"worker {self.address}: no open Step stream")

    async def send(self, plan: StepPlan) -> asyncio.Future[wpb.StepResult]:
        """Writes the plan on the stream; the future its result completes (in order)."""
        self.raise_if_lost()
        epoch = self.epoch
        answer: asyncio.Future[wpb.StepResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((plan.step_id, answer))
        try:
            await self._stream.write(plan_to_proto(plan))
        except grpc.aio.AioRpcError as error:
            self._lose(epoch, self._rpc_lost(error))
        except asyncio.InvalidStateError:
            # A write on a call that has ended: the reader says why, or is about to.
            await asyncio.sleep(0)
            self._lose(epoch, WorkerLost(f"worker {self.address}: its Step stream has ended"))
        self.raise_if_lost()
        return answer

    async def send_masks(self, masks: DeferredMasks) -> None:
        """Writes a plan's deferred masks on the stream (no result comes for them)."""
        self.raise_if_lost()
        epoch = self.epoch
        try:
            await self._stream.write(deferred_masks_to_proto(masks))
        except grpc.aio.AioRpcError as error:
            self._lose(epoch, self._rpc_lost(error))
        except asyncio.InvalidStateError:
            await asyncio.sleep(0)
            self._lose(epoch, WorkerLost(f"worker {self.address}: its Step stream has ended"))
        self.raise_if_lost()

    async def result(
        self, plan: StepPlan, answer: asyncio.Future[wpb.StepResult], deadline_s: float
    ) -> StepOutput:
        """The sent plan's output, or WorkerLost when none comes within deadline_s from
        now (the caller waits for results in order, so this is once the step before it
        has answered: when the worker starts this one)."""
        epoch = self.epoch
        try:
            # Not wait_for: on Python 3.10 and 3.11 it loses a cancel that meets the
            # answer, and the engine's loop would outlive its stop (common.cancel_safe).
            if await done_within(answer, deadline_s):
                return output_from_proto(answer.result())
            self._lose(
                epoch,
                WorkerLost(
                    f"worker {self.address} gave no result for step {plan.step_id} "
                    f"({plan.num_scheduled_tokens} tokens) within {deadline_s:.3g} s",
                    LossCause.STEP_TIMEOUT,
                ),
            )
        except ValueError as error:  # top_token_ids and top_logprobs of unequal length
            self._lose(
                epoch,
                WorkerLost(
                    f"worker {self.address}: step {plan.step_id}: {error}", LossCause.PROTOCOL
                ),
            )
        except (WorkerLost, asyncio.CancelledError) as error:
            if isinstance(error, asyncio.CancelledError) and not answer.cancelled():
                raise  # the caller was cancelled, not the step
            self._lose(epoch, error if isinstance(error, WorkerLost) else self._closed())
        raise self.lost or self._closed()

    async def step(self, plan: StepPlan, deadline_s: float) -> StepOutput:
        """One plan and its output: send, then result."""
        return await self.result(plan, await self.send(plan), deadline_s)

    async def load_adapter(self, slot: int, adapter: AdapterInfo) -> wpb.LoadAdapterReply:
        """Worker.LoadAdapter into `slot`, beside the Step stream; raises ServiceError
        with the worker's status and reason (UNAVAILABLE without a connection)."""
        request = wpb.LoadAdapterRequest(
            slot=slot, lora_id=adapter.lora_id, lora_name=adapter.name, lora_path=adapter.path
        )
        what = f"load LoRA adapter {adapter.name!r}"
        return await self._adapter_call("LoadAdapter", request, what)

    async def unload_adapter(self, slot: int) -> None:
        """Worker.UnloadAdapter of `slot`; raises ServiceError as load_adapter does."""
        request = wpb.UnloadAdapterRequest(slot=slot)
        await self._adapter_call("UnloadAdapter", request, f"unload adapter slot {slot}")

    async def send_kv(
        self,
        transfer_id: int,
        destination: str,
        source_block_ids: list[int],
        destination_block_ids: list[int],
        num_tokens: int,
        timeout_s: float,
    ) -> wpb.SendKvReply:
        """Worker.SendKv: this worker streams the blocks' KV to `destination`, beside
        both workers' steps; raises ServiceError as load_adapter does (a deadline passed:
        DEADLINE_EXCEEDED)."""
        request = wpb.SendKvRequest(
            transfer_id=transfer_id,
            destination=destination,
            source_block_ids=source_block_ids,
            destination_block_ids=destination_block_ids,
            num_tokens=num_tokens,
        )
        what = f"send KV transfer {transfer_id} to {destination}"
        return await self._adapter_call("SendKv", request, what, timeout_s)

    async def _adapter_call(
        self, method: str, request, what: str, timeout_s: float = ADAPTER_CALL_TIMEOUT_S
    ):
        if self._stub is None:
            unavailable = grpc.StatusCode.UNAVAILABLE
            raise ServiceError(f"worker {self.address} is not connected", unavailable)
        epoch = self.epoch
        try:
            return await getattr(self._stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise ServiceError(
                f"worker {self.address} could not {what}: {error.details()}", error.code()
            ) from None
        except asyncio.CancelledError:
            # close() (the worker was lost) cancels the channel's calls, which raise
            # CancelledError: this call failed. A cancel of this task is re-raised (on
            # 3.10, without Task.cancelling, one that races a close is taken as that).
            task = asyncio.current_task()
            if self.epoch == epoch or (task is not None and _cancelling(task)):
                raise
            lost = f"worker {self.address} was lost: could not {what}"
            raise ServiceError(lost, grpc.StatusCode.UNAVAILABLE) from None

    def _closed(self) -> WorkerLost:
        return WorkerLost(f"worker {self.address}: its Step stream was closed")

    async def close(self) -> None:
        """Gives the current stream up: its reader stops, and what it would read is stale."""
        self.epoch += 1
        for _, answer in self._waiting:
            answer.cancel()
        self._waiting.clear()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _cancelling(task: asyncio.Task) -> bool:
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is not None and cancelling() > 0
