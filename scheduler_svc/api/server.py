"""The public gRPC service, cbserve.v1.Generation, on the scheduler, and the one
request path every door uses.

generate() validates the request, hands it to a worker's engine (the pool
picks which), and yields that engine's outputs as GenerateResponses, raising
ServiceError on a refusal or failure. gRPC's Generate and the HTTP front
(scheduler_svc/api/http) both iterate it; each only translates. A client that
cancels or disconnects ends the iteration, whose cleanup aborts the request so
that its blocks are freed at the next step. Each call keeps a RequestTrace:
its metrics and its one summary log line.

drain() is the graceful shutdown: new calls get UNAVAILABLE, calls in flight
get the grace period to finish, and those still running then end with
UNAVAILABLE (their blocks freed) rather than being cut off silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from structlog.contextvars import bound_contextvars

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.errors import ServiceError
from common.metrics import exposition
from scheduler_svc.api import admission
from scheduler_svc.api.limits import ModelLimits
from scheduler_svc.api.pool_view import PlacedRequest, PoolView
from scheduler_svc.api.request_trace import RequestTrace
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.api.validation import (
    MAX_REQUEST_ID_CHARS,
    ValidatedRequest,
    validate_request,
)
from scheduler_svc.api.wire import refuse_undecodable, to_response
from scheduler_svc.core.request import FinishReason, RequestOutput
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.output.output_processor import merge_outputs
from scheduler_svc.output.text_stream import TextStream
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import StreamItem


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's gRPC deadline as a time.monotonic() value, if the client set one."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + remaining


class GenerationService(pb_grpc.GenerationServicer):
    def __init__(
        self,
        pool: PoolView,
        tokenizer: Tokenizer,
        max_waiting_requests: int = 1024,
        metrics: SchedulerMetrics | None = None,
        max_concurrent_streams: int = 1024,
        remote_exposition: Callable[[str], Awaitable[tuple[bytes, str]]] | None = None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        """remote_exposition: where /metrics comes from in an API process (the core's
        whole registry, split/remote_pool.py); None: this process's registry."""
        self.pool = pool
        self._remote_exposition = remote_exposition
        self.tokenizer = tokenizer
        self.grammars = (
            grammars if grammars is not None else GrammarCompiler.for_tokenizer(tokenizer)
        )
        self.max_waiting_requests = max_waiting_requests
        self.max_concurrent_streams = max_concurrent_streams
        self.metrics = metrics if metrics is not None else SchedulerMetrics(tokenizer.name)
        self._in_flight: set[str] = set()
        # Generate calls between their first line and their last, valid or not.
        self._num_streams = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        # Placed requests by id, so that drain() can end them.
        self._placed: dict[str, PlacedRequest] = {}

    def limits(self) -> ModelLimits:
        """What requests are validated against now (all zero before any worker)."""
        return self._limits()

    def _limits(self) -> ModelLimits:
        return ModelLimits(
            max_model_len=self.pool.max_model_len,
            vocab_size=self.pool.vocab_size,
            kv_capacity_tokens=self.pool.max_worker_capacity_tokens,
        )

    async def _place(
        self, request: pb.GenerateRequest, deadline: float | None, trace: RequestTrace
    ) -> tuple[ValidatedRequest, PlacedRequest]:
        """Validates the request and queues it on a worker; raises ServiceError.

        With no worker connected, it waits for one (the pool's orphanage), unless
        no worker has ever connected: then it is refused at once.
        """
        admission.require_a_worker(
            bool(self.pool.connected_engines()), self.pool.accepts_without_worker()
        )
        # An unknown adapter is NOT_FOUND, one named with LoRA off INVALID_ARGUMENT.
        adapter = self.pool.adapter(request.lora_name)
        validated = validate_request(request, self.tokenizer, self._limits())
        # A structured output's grammar compiles in the compiler's thread (cached by
        # constraint): this call waits, every other request's steps go on.
        grammar = None
        if validated.constraint is not None:
            grammar = await self.grammars.compile(validated.constraint)
        admission.require_unique_id(validated.request_id, self._in_flight)
        admission.require_queue_room(self.pool.num_waiting, self.max_waiting_requests)
        submitted = trace.clock()
        handle = self.pool.submit(validated.to_request(deadline, grammar, adapter))
        trace.placed(handle.address, len(validated.prompt_token_ids), submitted)
        return validated, handle

    async def exposition(self, accept: str) -> tuple[bytes, str]:
        """The metrics body and Content-Type for a scrape that sent `accept`."""
        if self._remote_exposition is not None:
            return await self._remote_exposition(accept)
        return exposition(self.metrics.registry, accept)

    @property
    def draining(self) -> bool:
        return self._draining

    async def drain(self, grace_s: float) -> int:
        """Refuses new calls, waits up to grace_s for those in flight; returns how
        many were still running then, which end with UNAVAILABLE."""
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
            return 0
        except asyncio.TimeoutError:
            pass
        left = list(self._placed.items())
        for _request_id, handle in left:
            handle.abort()
            handle.fail(
                ServiceError(
                    "the server is shutting down (grace period over); retry on another server",
                    grpc.StatusCode.UNAVAILABLE,
                )
            )
        # Let the handlers send their status before the server stops.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 2.0)
        return len(left)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        await refuse_undecodable(request, context)
        try:
            async for response in self.generate(request, _deadline(context)):
                yield response
        except ServiceError as error:
            await context.abort(error.code, error.message)

    async def generate(
        self, request: pb.GenerateRequest, deadline: float | None = None
    ) -> AsyncIterator[pb.GenerateResponse]:
        """The one request path, whatever the door (gRPC's Generate, the HTTP front).

        Yields the request's responses and raises ServiceError when it is refused or
        fails; deadline is a time.monotonic() value or None. Closing or cancelling
        the iteration (a client gone) aborts the request, so its blocks are freed at
        the next step. The request_id is bound in the structlog contextvars of the
        task that iterates, so every log line of the request carries it.
        """
        if self._draining:
            raise ServiceError(
                "the server is shutting down; retry on another", grpc.StatusCode.UNAVAILABLE
            )
        # Refused before any work, so that a flood of clients costs next to nothing.
        admission.require_stream_room(self._num_streams, self.max_concurrent_streams)
        self._num_streams += 1
        self._idle.clear()
        try:
            async for response in self._generate(request, deadline):
                yield response
        finally:
            self._num_streams -= 1
            if self._num_streams == 0:
                self._idle.set()

    async def _generate(self, request: pb.GenerateRequest, deadline: float | None):
        trace = RequestTrace(self.metrics)
        if not request.request_id:
            # Made up now, not in validation, so that a request refused before
            # validation still has an id in its log line.
            request.request_id = uuid.uuid4().hex
        # Every log line of this call carries its request_id (cut, in the lines
        # before validation refuses one that is too long).
        with bound_contextvars(request_id=request.request_id[:MAX_REQUEST_ID_CHARS]):
            try:
                validated, handle = await self._place(request, deadline, trace)
            except ServiceError as error:
                trace.failed(error.code, error.message)
                raise
            text = TextStream(self.tokenizer, validated.prompt_token_ids, validated.sampling)
            async for response in self._stream(handle, text, trace):
                yield response
            if trace.failure is not None:
                code, message = trace.failure
                raise ServiceError(message, code)

    async def _stream(self, handle: PlacedRequest, text: TextStream, trace: RequestTrace):
        """Yields the request's responses, their text made here (not in the core);
        records how it ended in trace."""
        request_id = handle.request_id
        self._in_flight.add(request_id)
        self._placed[request_id] = handle
        outcome: ServiceError | FinishReason | None = None
        held: ServiceError | None = None
        try:
            while outcome is None:
                if held is not None:
                    outcome = held
                    break
                item = await handle.queue.get()
                if isinstance(item, ServiceError):
                    outcome = item
                    break
                item, held = _coalesce(item, handle.queue)
                item, stopped = text.process(item)
                if stopped:
                    # A stop string: the core learns it here and drops the request.
                    handle.abort()
                    held = None
                trace.token_sent(item)
                outcome = item.finish_reason
                yield to_response(item, self.tokenizer)
        finally:
            self._in_flight.discard(request_id)
            self._placed.pop(request_id, None)
            trace.first_scheduled = handle.first_scheduled
            trace.worker = handle.address or trace.worker
            trace.moved_from = list(getattr(handle, "moved_from", ()))
            if outcome is None:
                # Cancelled, disconnected or past its deadline: free its blocks.
                handle.abort()
                trace.finished(FinishReason.ABORT.value)
            elif isinstance(outcome, ServiceError):
                trace.failed(outcome.code, outcome.message)
            else:
                trace.finished(outcome.value)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        await refuse_undecodable(request, context)
        engines: list[WorkerEngine] = self.pool.connected_engines()
        if not engines:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no worker is connected")
        description = engines[0].client.description
        return pb.ModelInfo(
            model_name=description.model_name,
            max_model_len=self.pool.max_model_len,
            vocab_size=self.pool.vocab_size,
            eos_token_ids=self.tokenizer.eos_token_ids,
            block_size=description.block_size,
            kv_capacity_tokens=sum(engine.capacity_tokens for engine in engines),
            num_workers=len(engines),
            workers=sorted(engine.address for engine in engines),
            worker_info=[
                _worker_info(engine) for engine in sorted(engines, key=lambda e: e.address)
            ],
            lora_adapters=[
                pb.LoraAdapter(
                    name=info.name,
                    path=info.path,
                    base_model_name=info.base_model_name,
                    rank=info.rank,
                )
                for info in self.pool.adapters()
            ],
        )


def _coalesce(
    first: RequestOutput, queue: asyncio.Queue[StreamItem]
) -> tuple[RequestOutput, ServiceError | None]:
    """The first output merged with any that queued up behind it, and an error that
    ended the request after them (sent after the merged output).

    Outputs queue up only while the client reads slower than the steps produce them
    (gRPC's flow control holds the handler in its write): then one message carries
    the text of several steps, as SGLang's stream interval and the OpenAI stream shape
    allow, and the client catches up instead of falling further behind. A client that
    keeps up gets one message a step, as before.
    """
    if queue.empty() or first.finish_reason is not None:
        return first, None
    outputs = [first]
    while not queue.empty() and outputs[-1].finish_reason is None:
        item = queue.get_nowait()
        if isinstance(item, ServiceError):
            return merge_outputs(outputs), item
        outputs.append(item)
    return merge_outputs(outputs), None


def _worker_info(engine: WorkerEngine) -> pb.WorkerInfo:
    described = engine.client.description
    return pb.WorkerInfo(
        address=engine.address,
        dtype=described.dtype,
        model_impl=described.model_impl,
        attention_backend=described.attention_backend,
        device=described.device,
        processor=described.processor,
    )
