"""Every kind of bad input gets INVALID_ARGUMENT naming the field; the service keeps serving."""

from __future__ import annotations

import grpc
import pytest

BAD_REQUESTS = [
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature"),
    ({"prompt": "hi", "top_p": 0.0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -2}, "top_k"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "min_p": 1.5}, "min_p"),
    ({"prompt": "hi", "presence_penalty": 3.0}, "presence_penalty"),
    ({"prompt": "hi", "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0.0}, "repetition_penalty"),
    ({"prompt": "hi", "logprobs": 100}, "logprobs"),
    ({"prompt": "hi", "max_tokens": 9000}, "max_tokens"),
    ({"token_ids": [1, 2, 60000]}, "prompt_token_ids"),
    ({"token_ids": []}, "prompt_token_ids"),
    ({"chat": [("wizard", "hello")]}, "role"),
    ({"chat": []}, "chat"),
    ({"prompt": "hi", "stop_token_ids": [49152]}, "stop_token_ids"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD_REQUESTS, ids=[f for _, f in BAD_REQUESTS])
def test_bad_input_is_invalid_argument(client, kwargs, field):
    with pytest.raises(grpc.RpcError) as raised:
        client.complete(timeout=30, **kwargs)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in raised.value.details()


def test_prompt_longer_than_model_is_refused(client):
    with pytest.raises(grpc.RpcError) as raised:
        client.complete(token_ids=[42] * 8192, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum length" in raised.value.details()


def test_missing_input_is_refused(stack):
    from cbserve.v1 import generation_pb2 as pb
    from cbserve.v1 import generation_pb2_grpc as pb_grpc

    with grpc.insecure_channel(stack.address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(pb_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(), timeout=30))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input" in raised.value.details()


def test_still_serving_after_bad_input(client):
    for kwargs, _ in BAD_REQUESTS:
        with pytest.raises(grpc.RpcError):
            client.complete(timeout=30, **kwargs)
    completion = client.complete("Hello", temperature=0.0, max_tokens=4, ignore_eos=True)
    assert len(completion.token_ids) == 4
