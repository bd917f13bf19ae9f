"""The client side of a run, on a fake AsyncClient: what is timed, concurrency, errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bench.harness.runner import (
    ClientSettings,
    counter_growth,
    drive,
    short_outputs,
    stream_one,
)
from bench.harness.workload import BenchRequest
from cbserve.v1 import generation_pb2 as pb


class FakeClient:
    """Streams one token per max_tokens, each after a short sleep; counts concurrency."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.active = 0
        self.most_active = 0
        self.calls: list[dict] = []

    async def generate(self, **kwargs):
        self.calls.append(kwargs)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if self.fail:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
                )
            yield pb.GenerateResponse(text="")  # a message without tokens is not timed
            for index in range(kwargs["max_tokens"]):
                await asyncio.sleep(0.01)
                last = index == kwargs["max_tokens"] - 1
                yield pb.GenerateResponse(
                    token_ids=[7], finish_reason=pb.FinishReason.Value("LENGTH") if last else 0
                )
        finally:
            self.active -= 1


def requests(count: int, max_tokens: int = 3) -> list[BenchRequest]:
    return [BenchRequest(i, [1, 2, 3 + i], max_tokens, seed=100 + i) for i in range(count)]


def drive_fake(client: FakeClient, batch: list[BenchRequest], settings: ClientSettings):
    async def send(request: BenchRequest):
        return await stream_one(client, request, settings)

    return asyncio.run(drive(send, batch, float("inf"), settings, "x"))


def test_stream_one_times_token_messages_and_sends_the_settings():
    client = FakeClient()
    settings = ClientSettings(temperature=0.5, ignore_eos=True)
    timing = asyncio.run(stream_one(client, requests(1)[0], settings))
    assert timing.ok and timing.output_tokens == 3 and len(timing.chunks) == 3
    assert timing.finish_reason == "LENGTH"
    assert timing.ttft >= 0.01
    assert client.calls[0] == {
        "token_ids": [1, 2, 3],
        "max_tokens": 3,
        "ignore_eos": True,
        "temperature": 0.5,
        "seed": 100,
    }


def test_a_failed_request_records_its_status():
    timing = asyncio.run(stream_one(FakeClient(fail=True), requests(1)[0], ClientSettings()))
    assert not timing.ok and timing.error == "UNAVAILABLE: gone"


@pytest.mark.parametrize(("limit", "expected"), [(None, 5), (2, 2), (1, 1)])
def test_max_concurrency_holds_back_requests(limit, expected):
    client = FakeClient()
    settings = ClientSettings(max_concurrency=limit, progress=False)
    timings, wall = drive_fake(client, requests(5), settings)
    assert client.most_active == expected
    assert all(t.ok for t in timings) and wall > 0
    assert short_outputs(requests(5), timings) == []


def test_short_outputs_names_requests_that_stopped_early():
    client = FakeClient()
    timings, _ = drive_fake(client, requests(2, 2), ClientSettings(progress=False))
    assert short_outputs(requests(2, 3), timings) == [(0, 2, 3), (1, 2, 3)]


def test_counter_growth_keeps_counters_and_histogram_totals_only():
    before = {"a_total": 1.0, 'b_seconds_sum{worker="0"}': 2.0, "queue": 5.0}
    after = {"a_total": 4.0, 'b_seconds_sum{worker="0"}': 2.5, "b_seconds_count": 3.0, "queue": 1}
    assert counter_growth(before, after) == {
        "a_total": 3.0,
        'b_seconds_sum{worker="0"}': 0.5,
        "b_seconds_count": 3.0,
    }
