"""cbserve.Client retries refused calls through gRPC's retryPolicy, over real gRPC.

A small cbserve.v1.Generation server on loopback refuses the first calls it gets with
the codes a test gives it, then answers; it counts the attempts it saw.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from cbserve.client import AsyncClient, Client
from cbserve.retry import RetryPolicy
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc

# Short backoffs keep the test quick; the policy is the one the Client is given.
FAST = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class RefusingGeneration(pb_grpc.GenerationServicer):
    def __init__(self) -> None:
        self.refusals: list[grpc.StatusCode] = []
        self.attempts = 0
        # Fail the stream after its first message (a worker lost mid-reply).
        self.fail_after_first = False

    async def Generate(self, request, context):
        self.attempts += 1
        if self.refusals:
            await context.abort(self.refusals.pop(0), "refused by the test")
        yield pb.GenerateResponse(request_id=request.request_id, text="hello")
        if self.fail_after_first:
            await context.abort(UNAVAILABLE, "lost mid-stream")
        yield pb.GenerateResponse(text=" world", finish_reason=pb.STOP)

    async def GetModelInfo(self, request, context):
        self.attempts += 1
        if self.refusals:
            await context.abort(self.refusals.pop(0), "refused by the test")
        return pb.ModelInfo(model_name="test-model")


@pytest.fixture
def server():
    """The servicer, and the address of its grpc.aio server (on a loop in a thread)."""
    servicer = RefusingGeneration()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def serve() -> None:
        aio_server = grpc.aio.server()
        pb_grpc.add_GenerationServicer_to_server(servicer, aio_server)
        state["port"] = aio_server.add_insecure_port("127.0.0.1:0")
        await aio_server.start()
        state["server"] = aio_server
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop)
    assert started.wait(10)
    yield servicer, f"127.0.0.1:{state['port']}"
    asyncio.run_coroutine_threadsafe(state["server"].stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize(
    "refusals",
    [[RESOURCE_EXHAUSTED], [UNAVAILABLE, RESOURCE_EXHAUSTED, UNAVAILABLE]],
    ids=["one", "three"],
)
def test_refused_generate_is_retried_until_answered(server, refusals):
    servicer, address = server
    servicer.refusals = list(refusals)
    with Client(address, retry=FAST) as client:
        completion = client.complete("hi", timeout=10)
    assert completion.text == "hello world"
    assert servicer.attempts == len(refusals) + 1


def test_a_non_retryable_code_is_not_retried(server):
    servicer, address = server
    servicer.refusals = [grpc.StatusCode.INVALID_ARGUMENT]
    with Client(address, retry=FAST) as client, pytest.raises(grpc.RpcError) as error:
        client.complete("hi", timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert servicer.attempts == 1


def test_attempts_stop_at_max_attempts(server):
    servicer, address = server
    servicer.refusals = [UNAVAILABLE] * 5
    three = RetryPolicy(max_attempts=3, initial_backoff_s=0.01)
    with Client(address, retry=three) as client, pytest.raises(grpc.RpcError) as error:
        client.complete("hi", timeout=10)
    assert error.value.code() == UNAVAILABLE
    assert servicer.attempts == 3


def test_no_retry_when_turned_off(server):
    servicer, address = server
    servicer.refusals = [RESOURCE_EXHAUSTED]
    with Client(address, retry=None) as client, pytest.raises(grpc.RpcError) as error:
        client.complete("hi", timeout=10)
    assert error.value.code() == RESOURCE_EXHAUSTED
    assert servicer.attempts == 1


def test_a_stream_that_fails_after_its_first_response_is_not_retried(server):
    # Retrying would stream the reply again from its start.
    servicer, address = server
    servicer.fail_after_first = True
    received = []
    with Client(address, retry=FAST) as client, pytest.raises(grpc.RpcError) as error:
        for response in client.generate("hi", timeout=10):
            received.append(response.text)
    assert error.value.code() == UNAVAILABLE
    assert received == ["hello"]
    assert servicer.attempts == 1


def test_unary_calls_and_the_async_client_retry_too(server):
    servicer, address = server
    servicer.refusals = [RESOURCE_EXHAUSTED, UNAVAILABLE]

    async def ask() -> tuple[str, str]:
        async with AsyncClient(address, retry=FAST) as client:
            info = await client.model_info()
            servicer.refusals = [UNAVAILABLE]
            completion = await client.complete("hi", timeout=10)
            return info.model_name, completion.text

    assert asyncio.run(ask()) == ("test-model", "hello world")
    assert servicer.attempts == 3 + 2


@pytest.mark.parametrize(
    "bad",
    [
        {"max_attempts": 1},
        {"max_attempts": 6},
        {"initial_backoff_s": 0},
        {"backoff_multiplier": -1},
        {"retryable_status_codes": ("UNAVAILABLE", "NOT_A_CODE")},
        {"retryable_status_codes": "UNAVAILABLE"},
    ],
)
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RetryPolicy(**bad)
