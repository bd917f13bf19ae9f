"""The split scheduler's two ends without processes: the codecs of messages.py, the
core's EdgeHub over a fake pool and channel, and the API process's RemotePool
dispatching what the core sends. (test_api_processes*.py run the real processes.)"""

from __future__ import annotations

import asyncio
import math
import pickle
from types import SimpleNamespace

import grpc
import pytest
from prometheus_client import Counter

from cbserve.worker.v1 import worker_pb2
from common.errors import InvalidArgument, ServiceError
from common.metrics import new_registry
from scheduler_svc.core.request import FinishReason, RequestOutput, TokenLogprob
from scheduler_svc.split import messages as m
from scheduler_svc.split.channel import ChannelClosed
from scheduler_svc.split.core_side import EdgeHub
from scheduler_svc.split.remote_pool import RemotePool
from scheduler_svc.workers.handle import RequestHandle

from .harness import make_request

WORKER = "10.0.0.7:50061"
_CLOSED = object()


class FakeChannel:
    """Records what is sent; recv() returns what the test feeds, ChannelClosed at close."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.inbox: asyncio.Queue = asyncio.Queue()

    def send(self, message: tuple) -> None:
        # As the real channel does: what crosses must pickle.
        self.sent.append(pickle.loads(pickle.dumps(message)))

    async def recv(self) -> tuple:
        message = await self.inbox.get()
        if message is _CLOSED:
            raise ChannelClosed("closed by the test")
        return message

    def feed(self, *messages) -> None:
        for message in messages:
            self.inbox.put_nowait(message)

    def hang_up(self) -> None:
        self.inbox.put_nowait(_CLOSED)

    async def close(self) -> None:
        self.hang_up()

    def of_kind(self, kind: str) -> list[tuple]:
        return [message for message in self.sent if message[0] == kind]


class FakeHolder:
    address = WORKER

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_local(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True


class FakePool:
    """What EdgeHub reads and calls of WorkerPool."""

    def __init__(self, connected: bool = True) -> None:
        description = worker_pb2.WorkerDescription(model_name="m", block_size=16)
        engine = SimpleNamespace(address=WORKER, capacity_tokens=4096, client=None)
        engine.client = SimpleNamespace(description=description)
        self.engines = [engine] if connected else []
        self.holder = FakeHolder()
        self.submitted: list = []
        self.handles: dict[str, RequestHandle] = {}
        self.num_waiting = 0
        self.max_model_len, self.vocab_size, self.max_worker_capacity_tokens = 2048, 49152, 4096
        self.changed = asyncio.Event()

    def connected_engines(self):
        return self.engines

    def accepts_without_worker(self) -> bool:
        return False

    def submit(self, request) -> RequestHandle:
        self.submitted.append(request)
        handle = self.handles[request.request_id] = RequestHandle(request.request_id, self.holder)
        return handle


def _output(request_id: str, tokens: list[int], reason: FinishReason | None = None, **extra):
    return RequestOutput(
        request_id=request_id,
        new_token_ids=tokens,
        new_text="",
        logprobs=extra.pop("logprobs", []),
        finish_reason=reason,
        prompt_tokens=extra.pop("prompt_tokens", 3),
        completion_tokens=extra.pop("completion_tokens", len(tokens)),
        **extra,
    )


# -- the codecs ------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", [None, *FinishReason])
def test_an_output_survives_encoding_and_pickling(reason):
    logprobs = [TokenLogprob(7, -0.25, ((7, -0.25), (9, -1.5)))]
    output = _output("r1", [7], reason, logprobs=logprobs, cached_prompt_tokens=16)
    decoded = m.decode_output(pickle.loads(pickle.dumps(m.encode_output(output))))
    assert decoded == output


def test_prompt_logprobs_cross_with_the_first_output():
    prompt_logprobs = [TokenLogprob(1, math.nan), TokenLogprob(5, -2.0, ((4, -1.0),))]
    output = _output("r1", [7], prompt_logprobs=prompt_logprobs)
    decoded = m.decode_output(pickle.loads(pickle.dumps(m.encode_output(output))))
    assert decoded.prompt_logprobs[1] == prompt_logprobs[1]
    assert decoded.prompt_logprobs[0].token_id == 1 and math.isnan(
        decoded.prompt_logprobs[0].logprob
    )
    assert m.decode_output(m.encode_output(_output("r2", [8]))).prompt_logprobs is None


@pytest.mark.parametrize(
    "error",
    [
        ServiceError("queue full", grpc.StatusCode.RESOURCE_EXHAUSTED),
        InvalidArgument("sampling.top_p", "must be in (0, 1]"),
        ServiceError("default code"),
    ],
)
def test_an_error_keeps_its_message_and_code(error):
    decoded = m.decode_error(pickle.loads(pickle.dumps(m.encode_error(error))))
    assert isinstance(decoded, ServiceError)
    assert (decoded.message, decoded.code) == (error.message, error.code)


# -- the core's hub ---------------------------------------------------------------------------


class Hub:
    """An EdgeHub over a FakePool, with API processes connected through FakeChannels."""

    def __init__(self, pool: FakePool, num_edges: int = 1, **limits) -> None:
        self.pool = pool
        self.lost: list[int] = []
        self.hub = EdgeHub(
            pool,
            new_registry(),
            num_edges=num_edges,
            max_waiting_requests=limits.get("max_waiting_requests", 100),
            max_concurrent_streams=limits.get("max_concurrent_streams", 100),
            on_edge_lost=self.lost.append,
        )
        self.tasks: list[asyncio.Task] = []

    async def connect(self, index: int) -> FakeChannel:
        channel = FakeChannel()
        channel.feed((m.HELLO, index))
        self.tasks.append(asyncio.create_task(self.hub.on_channel(channel)))
        await _settle()
        return channel

    async def stop(self) -> None:
        await self.hub.stop()
        await asyncio.gather(*self.tasks)


async def _settle() -> None:
    """Lets every ready task and call_soon callback (the hub's flushes) run."""
    for _ in range(5):
        await asyncio.sleep(0)


def _submit(request_id: str, prompt=(1, 2, 3), priority: int = 0, deadline=None) -> tuple:
    sampling = make_request(list(prompt), request_id, max_tokens=5).sampling
    return (m.SUBMIT, request_id, list(prompt), sampling, priority, deadline)


def _endings(channel: FakeChannel) -> list[tuple]:
    return [ending for message in channel.of_kind(m.OUTPUTS) for ending in message[2]]


def _refusal(channel: FakeChannel, request_id: str) -> ServiceError:
    (ending,) = [ending for ending in _endings(channel) if ending[0] == request_id]
    assert ending[1] is None and ending[2] == ""
    return m.decode_error(ending[3])


def test_hello_gets_a_snapshot_and_ready_waits_for_every_api_process():
    async def scenario():
        hub = Hub(FakePool(), num_edges=2)
        first = await hub.connect(0)
        (snapshot_message,) = first.of_kind(m.SNAPSHOT)
        assert not hub.hub.ready.is_set()
        await hub.connect(1)
        assert hub.hub.ready.is_set()
        await hub.stop()
        return snapshot_message[1]

    snapshot = asyncio.run(scenario())
    assert [engine.address for engine in snapshot.engines] == [WORKER]
    assert snapshot.max_model_len == 2048 and snapshot.vocab_size == 49152
    description = worker_pb2.WorkerDescription.FromString(snapshot.engines[0].description)
    assert description.model_name == "m"


def test_a_submit_becomes_a_request_of_the_core():
    async def scenario():
        hub = Hub(FakePool())
        channel = await hub.connect(0)
        channel.feed(_submit("a", prompt=(4, 5), priority=2, deadline=123.0))
        await _settle()
        live = hub.hub.num_live
        await hub.stop()
        return hub.pool.submitted, live

    (request,), live = asyncio.run(scenario())
    assert live == 1
    assert (request.request_id, request.prompt_token_ids) == ("a", [4, 5])
    assert (request.priority, request.deadline, request.sampling.max_tokens) == (2, 123.0, 5)
    assert request.arrival_time > 0


@pytest.mark.parametrize(
    ("connected", "limits", "code", "words"),
    [
        (False, {}, grpc.StatusCode.UNAVAILABLE, "no worker"),
        (True, {"max_concurrent_streams": 1}, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-con"),
        (True, {"max_waiting_requests": 0}, grpc.StatusCode.RESOURCE_EXHAUSTED, "queued"),
    ],
)
def test_a_submit_over_a_limit_of_the_whole_deployment_is_refused(connected, limits, code, words):
    async def scenario():
        hub = Hub(FakePool(connected), **limits)
        channel = await hub.connect(0)
        if "max_concurrent_streams" in limits:
            channel.feed(_submit("first"))
        channel.feed(_submit("refused"))
        await _settle()
        await hub.stop()
        return channel

    refusal = _refusal(asyncio.run(scenario()), "refused")
    assert refusal.code == code and words in refusal.message


def test_a_request_id_in_flight_on_another_api_process_is_already_exists():
    async def scenario():
        hub = Hub(FakePool(), num_edges=2)
        first, second = await hub.connect(0), await hub.connect(1)
        first.feed(_submit("same"))
        await _settle()
        second.feed(_submit("same"))
        await _settle()
        live = hub.hub.num_live
        await hub.stop()
        return first, second, live

    first, second, live = asyncio.run(scenario())
    assert _refusal(second, "same").code == grpc.StatusCode.ALREADY_EXISTS
    assert _endings(first) == [] and live == 1


def test_one_outputs_message_per_flush_carries_every_request_of_the_step():
    async def scenario():
        hub = Hub(FakePool())
        channel = await hub.connect(0)
        channel.feed(_submit("a"), _submit("b"), _submit("c"))
        await _settle()
        handles = hub.pool.handles
        handles["a"].first_scheduled = 41.5
        # One step's delivery, as the step loop makes it: all before the loop turns.
        handles["a"].queue.put_nowait(_output("a", [10, 11], FinishReason.LENGTH))
        handles["b"].queue.put_nowait(_output("b", [12]))
        handles["c"].queue.put_nowait(ServiceError("too long", grpc.StatusCode.OUT_OF_RANGE))
        await _settle()
        live = hub.hub.num_live
        await hub.stop()
        return channel, live

    channel, live = asyncio.run(scenario())
    (message,) = channel.of_kind(m.OUTPUTS)
    _, outputs, endings = message
    assert [m.decode_output(fields).new_token_ids for fields in outputs] == [[10, 11], [12]]
    assert endings[0] == ("a", 41.5, WORKER, None)
    request_id, first_scheduled, address, error = endings[1]
    assert (request_id, first_scheduled, address) == ("c", None, WORKER)
    assert m.decode_error(error).code == grpc.StatusCode.OUT_OF_RANGE
    assert live == 1  # b runs on; a and c are forgotten


def test_abort_and_a_lost_api_process_free_their_requests():
    async def scenario():
        hub = Hub(FakePool(), num_edges=2)
        first, second = await hub.connect(0), await hub.connect(1)
        first.feed(_submit("a"), _submit("b"), (m.ABORT, "a"), (m.ABORT, "unknown"))
        second.feed(_submit("c"))
        await _settle()
        after_abort = hub.hub.num_live
        first.hang_up()
        await _settle()
        after_loss, lost = hub.hub.num_live, list(hub.lost)
        aborted = list(hub.pool.holder.aborted)
        await hub.stop()
        return aborted, after_abort, after_loss, lost

    aborted, after_abort, after_loss, lost = asyncio.run(scenario())
    assert aborted == ["a", "b"]
    assert (after_abort, after_loss, lost) == (2, 1, [0])


def test_a_metrics_request_is_answered_from_the_core_registry():
    async def scenario():
        hub = Hub(FakePool())
        Counter("cbserve_split_test", "a series of the core's", registry=hub.hub._registry).inc()
        channel = await hub.connect(0)
        channel.feed((m.METRICS, 7, ""))
        await _settle()
        await hub.stop()
        return channel.of_kind(m.METRICS)

    ((_, nonce, body, content_type),) = asyncio.run(scenario())
    assert nonce == 7 and content_type.startswith("text/plain")
    assert b"cbserve_split_test_total 1.0" in body


# -- the API process's pool -------------------------------------------------------------------


def _remote_with(*request_ids: str) -> tuple[RemotePool, FakeChannel, dict]:
    channel = FakeChannel()
    pool = RemotePool(channel)
    handles = {rid: pool.submit(make_request(4, rid, max_tokens=5)) for rid in request_ids}
    return pool, channel, handles


def _drained(handle) -> list:
    items = []
    while not handle.queue.empty():
        items.append(handle.queue.get_nowait())
    return items


def test_outputs_go_to_their_handles_and_an_ending_says_where_it_ran():
    async def scenario():
        pool, channel, handles = _remote_with("a", "b")
        outputs = [m.encode_output(_output("a", [1])), m.encode_output(_output("b", [2]))]
        pool._deliver(outputs, [])
        finished = m.encode_output(_output("a", [3], FinishReason.STOP))
        pool._deliver([finished, m.encode_output(_output("gone", [4]))], [("a", 9.0, WORKER, None)])
        # A request that ended is forgotten: a late output for it goes nowhere.
        pool._deliver([m.encode_output(_output("a", [5]))], [])
        return channel, handles

    channel, handles = asyncio.run(scenario())
    a_items, b_items = _drained(handles["a"]), _drained(handles["b"])
    assert [item.new_token_ids for item in a_items] == [[1], [3]]
    assert a_items[-1].finish_reason is FinishReason.STOP
    assert (handles["a"].first_scheduled, handles["a"].address) == (9.0, WORKER)
    assert [item.new_token_ids for item in b_items] == [[2]]
    assert [message[1] for message in channel.of_kind(m.SUBMIT)] == ["a", "b"]


def test_an_ending_with_an_error_fails_its_handle_with_that_status():
    async def scenario():
        pool, _, handles = _remote_with("a")
        refused = ServiceError("in flight", grpc.StatusCode.ALREADY_EXISTS)
        pool._deliver([], [("a", None, "", m.encode_error(refused))])
        return handles["a"]

    (item,) = _drained(asyncio.run(scenario()))
    assert isinstance(item, ServiceError) and item.code == grpc.StatusCode.ALREADY_EXISTS
    assert item.message == "in flight"


def test_abort_is_sent_once_and_a_lost_core_fails_every_stream():
    async def scenario():
        pool, channel, handles = _remote_with("a", "b")
        handles["a"].abort()
        handles["a"].abort()
        reader = asyncio.create_task(pool.run())
        channel.feed((m.OUTPUTS, [m.encode_output(_output("b", [6]))], []))
        channel.hang_up()
        with pytest.raises(ChannelClosed):
            await reader
        return channel, handles

    channel, handles = asyncio.run(scenario())
    assert channel.of_kind(m.ABORT) == [(m.ABORT, "a")]
    assert _drained(handles["a"]) == []
    output, error = _drained(handles["b"])
    assert output.new_token_ids == [6]
    assert isinstance(error, ServiceError) and error.code == grpc.StatusCode.UNAVAILABLE


def test_a_snapshot_sets_the_limits_and_the_workers():
    async def scenario():
        pool = RemotePool(FakeChannel())
        hub = EdgeHub(
            FakePool(),
            new_registry(),
            num_edges=1,
            max_waiting_requests=1,
            max_concurrent_streams=1,
            on_edge_lost=lambda index: None,
        )
        pool._take_snapshot(hub.snapshot())
        return pool

    pool = asyncio.run(scenario())
    assert pool.first_snapshot.is_set() and pool.changed.is_set()
    assert [engine.address for engine in pool.connected_engines()] == [WORKER]
    assert pool.connected_engines()[0].client.description.block_size == 16
    assert (pool.max_model_len, pool.vocab_size, pool.max_worker_capacity_tokens) == (
        2048,
        49152,
        4096,
    )
