"""The core's end of the API processes (split/core_side.py's EdgeHub) over a fake pool
and fake channels: HELLO and readiness, submits and the refusals only the core can make
(limits of the whole deployment, duplicate ids across API processes), one OUTPUTS
message per flush, aborts, a lost API process, metrics. No process is started."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import Counter

from cbserve.worker.v1 import worker_pb2
from common.errors import ServiceError
from common.metrics import new_registry
from scheduler_svc.core.request import FinishReason
from scheduler_svc.split import messages as m
from scheduler_svc.split.core_side import EdgeHub
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import Constraint

from .harness import load_tokenizer, make_request
from .split_fakes import WORKER, FakeChannel, FakePool, make_output


class Hub:
    """An EdgeHub over a FakePool, with API processes connected through FakeChannels."""

    def __init__(self, pool: FakePool, num_edges: int = 1, **limits) -> None:
        self.pool = pool
        self.lost: list[int] = []
        self.hub = EdgeHub(
            pool,
            new_registry(),
            GrammarCompiler.for_tokenizer(load_tokenizer()),
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


def _submit(
    request_id: str, prompt=(1, 2, 3), priority: int = 0, deadline=None, constraint=None
) -> tuple:
    sampling = make_request(list(prompt), request_id, max_tokens=5).sampling
    return (m.SUBMIT, request_id, list(prompt), sampling, priority, deadline, "", constraint)


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
    assert request.structured is None


def test_a_constrained_submit_is_compiled_in_the_core_and_placed_with_a_matcher():
    choice = Constraint(kind="choice", text='["yes", "no"]')

    async def scenario():
        hub = Hub(FakePool())
        channel = await hub.connect(0)
        channel.feed(_submit("c", constraint=choice))
        for _ in range(200):  # the grammar compiles in a thread
            await asyncio.sleep(0.01)
            if hub.pool.submitted:
                break
        await hub.stop()
        return hub.pool.submitted

    (request,) = asyncio.run(scenario())
    assert request.structured is not None and request.structured.constraint == choice
    assert not request.structured.is_accepting  # nothing chosen yet


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
        handles["a"].queue.put_nowait(make_output("a", [10, 11], FinishReason.LENGTH))
        handles["b"].queue.put_nowait(make_output("b", [12]))
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
