"""The split scheduler's messages without processes: the codecs of split/messages.py,
and the API process's RemotePool dispatching what the core sends (outputs to their
handles, endings that say where a request ran or fail it, a lost core). The core's
end is test_split_edge_hub.py; test_api_processes*.py run the real processes."""

from __future__ import annotations

import asyncio
import math
import pickle

import grpc
import pytest

from common.errors import InvalidArgument, ServiceError
from common.metrics import new_registry
from scheduler_svc.core.request import FinishReason, TokenLogprob
from scheduler_svc.split import messages as m
from scheduler_svc.split.channel import ChannelClosed
from scheduler_svc.split.core_side import EdgeHub
from scheduler_svc.split.remote_pool import RemotePool

from .harness import make_request
from .split_fakes import WORKER, FakeChannel, FakePool, make_output


@pytest.mark.parametrize("reason", [None, *FinishReason])
def test_an_output_survives_encoding_and_pickling(reason):
    logprobs = [TokenLogprob(7, -0.25, ((7, -0.25), (9, -1.5)))]
    output = make_output("r1", [7], reason, logprobs=logprobs, cached_prompt_tokens=16)
    decoded = m.decode_output(pickle.loads(pickle.dumps(m.encode_output(output))))
    assert decoded == output


def test_prompt_logprobs_cross_with_the_first_output():
    prompt_logprobs = [TokenLogprob(1, math.nan), TokenLogprob(5, -2.0, ((4, -1.0),))]
    output = make_output("r1", [7], prompt_logprobs=prompt_logprobs)
    decoded = m.decode_output(pickle.loads(pickle.dumps(m.encode_output(output))))
    assert decoded.prompt_logprobs[1] == prompt_logprobs[1]
    assert decoded.prompt_logprobs[0].token_id == 1 and math.isnan(
        decoded.prompt_logprobs[0].logprob
    )
    assert m.decode_output(m.encode_output(make_output("r2", [8]))).prompt_logprobs is None


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
        outputs = [m.encode_output(make_output("a", [1])), m.encode_output(make_output("b", [2]))]
        pool._deliver(outputs, [])
        finished = m.encode_output(make_output("a", [3], FinishReason.STOP))
        pool._deliver(
            [finished, m.encode_output(make_output("gone", [4]))], [("a", 9.0, WORKER, None)]
        )
        # A request that ended is forgotten: a late output for it goes nowhere.
        pool._deliver([m.encode_output(make_output("a", [5]))], [])
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
        channel.feed((m.OUTPUTS, [m.encode_output(make_output("b", [6]))], []))
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
            grammars=None,  # only its snapshot is read here
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
