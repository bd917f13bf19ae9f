"""Hostile clients: whatever a GenerateRequest holds, the answer is OK or a documented status.

Generated requests (random and extreme values in every field, huge strings,
control characters, invalid chat roles, colliding ids, undecodable bytes) go to
a real scheduler over gRPC. Every call must end OK or with one of
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ALREADY_EXISTS, DEADLINE_EXCEEDED,
UNAVAILABLE: never INTERNAL or UNKNOWN, never a crash, and the service stays
healthy. Messages over the size limit are refused by gRPC itself. A stack of its
own, so that a crash here cannot take the session's stacks down.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cbserve.client import Client
from cbserve.local_stack import LocalStack
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.grpc_options import MAX_MESSAGE_BYTES
from common.health_probe import check
from tests.integration.split import NULL_WORKER_ARGS
from tests.waiting import wait_until

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
}
CALL_TIMEOUT_S = 30
# Generated calls: a long prompt that fits the model may prefill for a while on
# a CPU; its DEADLINE_EXCEEDED is a documented answer, and keeps the test short.
GENERATED_TIMEOUT_S = 10
# The client may send what it likes; only the server's limit applies.
RAW_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

INT32 = st.integers(-(2**31), 2**31 - 1)
UINT32 = st.integers(0, 2**32 - 1)
EXTREME_INT32 = st.sampled_from([-(2**31), -1, 0, 1, 2**31 - 1]) | INT32
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 2.0, 1e-45, 3.4e38, -3.4e38]
)
TEXT = st.text(max_size=64) | st.text(
    alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Zl", "Zp", "So"]),
    max_size=64,
)
HUGE_TEXT = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["x", " ", "\n", "\x00", "é", "🙂"]),
    st.sampled_from([50_000, 300_000, 2_000_000]),
)
ROLES = st.sampled_from(["system", "user", "assistant", "tool"]) | st.sampled_from(["user"]) | TEXT
# Small by default so that accepted requests finish fast; sometimes extreme.
MAX_TOKENS = st.integers(1, 4) | EXTREME_INT32


@st.composite
def plausible_sampling_params(draw) -> pb.SamplingParams:
    """In range, at the edges of the ranges: what a careful client may send."""
    unit = st.floats(0.0, 1.0, width=32)
    params = pb.SamplingParams(
        max_tokens=draw(st.integers(1, 4)),
        temperature=draw(st.sampled_from([0.0, 100.0]) | st.floats(0.0, 2.0, width=32)),
        top_p=draw(st.sampled_from([1.0, 1e-6]) | st.floats(0.125, 1.0, width=32)),
        top_k=draw(st.sampled_from([-1, 0, 1, 49152, 2**31 - 1])),
        min_p=draw(unit),
        presence_penalty=draw(st.floats(-2.0, 2.0, width=32)),
        frequency_penalty=draw(st.floats(-2.0, 2.0, width=32)),
        repetition_penalty=draw(st.sampled_from([2.0, 1e-3]) | st.floats(0.5, 2.0, width=32)),
        logprobs=draw(st.integers(0, 20)),
        ignore_eos=draw(st.booleans()),
    )
    params.min_tokens = draw(st.integers(0, params.max_tokens))
    if draw(st.booleans()):
        params.seed = draw(st.sampled_from([0, 2**64 - 1]) | st.integers(0, 2**64 - 1))
    params.stop.extend(draw(st.lists(TEXT.filter(bool), max_size=4)))
    params.stop_token_ids.extend(draw(st.lists(st.integers(0, 49151), max_size=8)))
    return params


@st.composite
def sampling_params(draw) -> pb.SamplingParams:
    if draw(st.booleans()):
        return draw(plausible_sampling_params())
    params = pb.SamplingParams(max_tokens=draw(MAX_TOKENS))
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
        if draw(st.booleans()):
            setattr(params, name, draw(FLOAT32))
    if draw(st.booleans()):
        params.repetition_penalty = draw(FLOAT32)
    for name in ("top_k", "min_tokens", "logprobs"):
        if draw(st.booleans()):
            setattr(params, name, draw(st.integers(-2, 25) | EXTREME_INT32))
    if draw(st.booleans()):
        params.seed = draw(st.integers(0, 2**64 - 1))
    params.stop.extend(draw(st.lists(TEXT | HUGE_TEXT, max_size=3) | st.lists(TEXT, max_size=40)))
    params.stop_token_ids.extend(draw(st.lists(UINT32 | st.integers(0, 49151), max_size=70)))
    params.ignore_eos = draw(st.booleans())
    return params


@st.composite
def generate_requests(draw) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        request_id=draw(st.sampled_from(["", "same-id"]) | TEXT | HUGE_TEXT.map(lambda t: t[:300])),
        priority=draw(EXTREME_INT32),
    )
    # Always with max_tokens: the default (256 tokens) would make the test slow.
    request.sampling.CopyFrom(draw(sampling_params()))
    kind = draw(st.sampled_from(["prompt", "prompt", "huge", "ids", "chat", "chat", "none"]))
    if kind == "prompt":
        request.prompt = draw(TEXT)
    elif kind == "huge":
        request.prompt = draw(HUGE_TEXT)
    elif kind == "ids":
        request.prompt_token_ids.SetInParent()
        request.prompt_token_ids.ids.extend(
            draw(st.lists(st.integers(0, 49151), max_size=64) | st.lists(UINT32, max_size=8))
            + [0] * draw(st.sampled_from([0, 0, 9000, 100_000]))
        )
    elif kind == "chat":
        request.chat.SetInParent()
        contents = TEXT | TEXT | HUGE_TEXT
        for role, content in draw(st.lists(st.tuples(ROLES, contents), min_size=1, max_size=4)):
            request.chat.messages.add(role=role, content=content)
        request.chat.messages.extend(
            [pb.ChatMessage(role="user", content="")] * draw(st.sampled_from([0, 0, 9000]))
        )
    return request


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand: no UTF-8 check on the way."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


BAD_UTF8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80", b"\xf8\x88\x80\x80"])


@st.composite
def raw_requests(draw) -> bytes:
    """Wire bytes: undecodable UTF-8 in string fields, or any bytes at all."""
    bad = draw(BAD_UTF8)
    choice = draw(st.sampled_from(["prompt", "request_id", "role", "content", "stop", "random"]))
    if choice == "prompt":
        return _field(2, bad)
    if choice == "request_id":
        return _field(1, bad) + _field(2, b"Hello")
    if choice == "role":
        return _field(4, _field(1, _field(1, bad) + _field(2, b"Hi")))
    if choice == "content":
        return _field(4, _field(1, _field(1, b"user") + _field(2, bad)))
    if choice == "stop":
        return _field(2, b"Hello") + _field(5, _field(8, bad))
    return draw(st.binary(max_size=256))


def _outcome(call) -> grpc.StatusCode:
    """Reads a Generate call to its end; checks that an OK one ended properly."""
    responses = []
    try:
        responses.extend(call)
    except grpc.RpcError as error:
        return error.code()
    assert responses and responses[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
    return grpc.StatusCode.OK


def _assert_healthy(address: str) -> None:
    serving, why = check(address, timeout=5.0)
    assert serving, why
    with Client(address) as client:
        completion = client.complete(
            "Hello", max_tokens=2, ignore_eos=True, temperature=0.0, timeout=60
        )
    assert len(completion.token_ids) == 2


@pytest.fixture(scope="module")
def hostile_stack():
    with LocalStack(worker_args=["--dtype", "float32"]) as stack:
        yield stack
        assert stack.first_exit() is None, "a process died"


@pytest.fixture(scope="module")
def channel(hostile_stack):
    with grpc.insecure_channel(hostile_stack.address, options=RAW_OPTIONS) as opened:
        yield opened


@pytest.mark.slow  # 17 s of generated requests; test_bad_input.py keeps the statuses
@settings(
    # 40: the mix of statuses shows at that size; 100 cost 40 s more of make test.
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(requests=st.lists(generate_requests(), min_size=1, max_size=2))
def test_generated_requests_get_documented_statuses(hostile_stack, channel, requests):
    stub = pb_grpc.GenerationStub(channel)
    # Started together: a repeated id collides with a request still in flight.
    calls = [stub.Generate(request, timeout=GENERATED_TIMEOUT_S) for request in requests]
    codes = [_outcome(call) for call in calls]
    for code in codes:
        event(code.name)  # the mix shows with --hypothesis-show-statistics
    assert set(codes) <= ALLOWED, codes
    assert hostile_stack.first_exit() is None, "a process died"


@settings(max_examples=60, deadline=None)
@given(raw=raw_requests())
def test_undecodable_requests_get_documented_statuses(hostile_stack, channel, raw):
    generate = channel.unary_stream(
        "/cbserve.v1.Generation/Generate",
        request_serializer=lambda data: data,
        response_deserializer=pb.GenerateResponse.FromString,
    )
    code = _outcome(generate(raw, timeout=CALL_TIMEOUT_S))
    event(code.name)
    assert code in ALLOWED, code
    assert hostile_stack.first_exit() is None, "a process died"


def test_oversized_message_is_refused_by_the_size_limit(hostile_stack, channel):
    stub = pb_grpc.GenerationStub(channel)
    request = pb.GenerateRequest(prompt="x" * (MAX_MESSAGE_BYTES + 1024))
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(request, timeout=CALL_TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value


def test_request_id_in_flight_is_already_exists(hostile_stack, channel):
    stub = pb_grpc.GenerationStub(channel)
    long = pb.GenerateRequest(
        request_id="twice",
        prompt="Hello",
        sampling=pb.SamplingParams(max_tokens=2000, ignore_eos=True),
    )
    first = stub.Generate(long, timeout=CALL_TIMEOUT_S)
    next(first)  # in flight now
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(long, timeout=CALL_TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.ALREADY_EXISTS
    first.cancel()


def test_service_is_healthy_after_hostile_input(hostile_stack):
    # Runs after the tests above (file order).
    _assert_healthy(hostile_stack.address)


def test_streams_past_max_concurrent_streams_are_resource_exhausted():
    # The limit is the scheduler's: a null worker (no weights; a step of a few ms keeps
    # the streams of 2000 tokens open) serves the streams it counts.
    with (
        LocalStack(
            worker_args=NULL_WORKER_ARGS, scheduler_args=["--max-concurrent-streams", "2"]
        ) as stack,
        grpc.insecure_channel(stack.address) as opened,
    ):
        stub = pb_grpc.GenerationStub(opened)
        long = pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=2000, ignore_eos=True)
        )
        open_calls = [stub.Generate(long, timeout=120) for _ in range(2)]
        for call in open_calls:
            next(call)  # both streams are open and producing
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Generate(long, timeout=30))
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-concurrent-streams" in raised.value.details()
        for call in open_calls:
            call.cancel()
        # Once the two are gone, a new call is served again.
        wait_until("a new call served once the two are cancelled", lambda: _served(stack.address))


def _served(address: str) -> bool:
    """Whether a call is served; refused only for the stream limit."""
    try:
        _assert_healthy(address)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        return False
    return True
