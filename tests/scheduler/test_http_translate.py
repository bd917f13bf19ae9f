"""The HTTP front's translation and error shapes, without a stack: OpenAI bodies ->
GenerateRequests, and refusals -> OpenAI's error JSON with the right status."""

from __future__ import annotations

import grpc
import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument, ServiceError
from scheduler_svc.api.http.errors import from_service_error, from_validation_error
from scheduler_svc.api.http.protocol import ChatCompletionRequest, CompletionRequest
from scheduler_svc.api.http.shaping import usage
from scheduler_svc.api.http.translate import chat_requests, completion_requests


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)


def test_chat_fields_become_the_proto_fields():
    body = _chat(
        max_completion_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        ignore_eos=True,
        priority=-3,
        stop="END",
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=11,
        user="someone",
    )
    [choice] = chat_requests(body, "abc")
    request = choice.request
    assert request.request_id == "abc"
    assert [(m.role, m.content) for m in request.chat.messages] == [("user", "hi")]
    sampling = request.sampling
    assert sampling.max_tokens == 7 and sampling.top_k == 5 and sampling.min_tokens == 2
    assert sampling.temperature == pytest.approx(0.5) and sampling.top_p == pytest.approx(0.9)
    assert sampling.min_p == pytest.approx(0.1)
    assert sampling.repetition_penalty == pytest.approx(1.2)
    assert sampling.ignore_eos and list(sampling.stop) == ["END"] and sampling.seed == 11
    assert sampling.presence_penalty == 0.5 and sampling.frequency_penalty == -0.5
    assert request.priority == -3 and sampling.logprobs == 0


def test_unset_fields_stay_unset_for_the_scheduler_defaults():
    [choice] = chat_requests(_chat(), "abc")
    for name in ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty"):
        assert not choice.request.sampling.HasField(name), name


def test_text_parts_are_joined():
    body = ChatCompletionRequest(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert chat_requests(body, "x")[0].request.chat.messages[0].content == "ab"


def test_chat_logprobs_ask_for_at_least_one_alternative():
    assert chat_requests(_chat(logprobs=True), "x")[0].request.sampling.logprobs == 1
    assert (
        chat_requests(_chat(logprobs=True, top_logprobs=4), "x")[0].request.sampling.logprobs == 4
    )
    with pytest.raises(InvalidArgument) as raised:
        chat_requests(_chat(top_logprobs=2), "x")
    assert raised.value.field == "top_logprobs"


def test_n_choices_have_their_own_ids_and_seeds():
    choices = chat_requests(_chat(n=3, seed=2**64 - 2), "rid")
    assert [c.index for c in choices] == [0, 1, 2]
    assert [c.request.request_id for c in choices] == ["rid-0", "rid-1", "rid-2"]
    # seed + i, wrapped into 64 bits, so the choices differ.
    assert [c.request.sampling.seed for c in choices] == [2**64 - 2, 2**64 - 1, 0]


def test_completion_prompts_strings_and_token_ids():
    assert completion_requests(CompletionRequest(prompt="hi"), "r")[0].request.prompt == "hi"
    [ids] = completion_requests(CompletionRequest(prompt=[1, 2, 3]), "r")
    assert list(ids.request.prompt_token_ids.ids) == [1, 2, 3]
    several = completion_requests(CompletionRequest(prompt=["a", "b"], n=2), "r")
    assert [(c.index, c.prompt_index, c.request.prompt) for c in several] == [
        (0, 0, "a"), (1, 0, "a"), (2, 1, "b"), (3, 1, "b"),
    ]  # fmt: skip
    # OpenAI's default for completions, not the scheduler's 256.
    assert several[0].request.sampling.max_tokens == 16


def test_completion_logprobs_zero_still_returns_the_sampled_token():
    [choice] = completion_requests(CompletionRequest(prompt="x", logprobs=0), "r")
    assert choice.request.sampling.logprobs == 1


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"stop": 5}, "stop"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_wrong_types_name_the_field(fields, param):
    with pytest.raises(ValidationError) as raised:
        CompletionRequest(prompt="x", **fields)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in raised.value.errors()]
    error = from_validation_error(RequestValidationError(errors))
    assert error.status == 400 and error.param == param
    assert error.body()["error"]["message"].startswith(param)


def test_range_errors_of_the_shared_path_name_the_openai_field():
    error = from_service_error(InvalidArgument("sampling.temperature", "must be in [0, 100]"))
    body = error.body()["error"]
    assert error.status == 400 and body["param"] == "temperature"
    assert body["type"] == "invalid_request_error" and "must be in" in body["message"]
    assert from_service_error(InvalidArgument("chat.messages[0].role", "bad")).param == (
        "messages[0].role"
    )


@pytest.mark.parametrize(
    "code, status",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.ALREADY_EXISTS, 409),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.INTERNAL, 500),
    ],
)
def test_grpc_codes_become_http_statuses(code, status):
    error = from_service_error(ServiceError("no", code))
    assert error.status == status
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_usage_counts_each_prompt_once_and_sums_completions():
    choices = completion_requests(CompletionRequest(prompt=["a", "b"], n=2), "r")
    finals = {
        c.index: pb.GenerateResponse(
            usage=pb.Usage(
                prompt_tokens=10 + c.prompt_index, completion_tokens=3, cached_prompt_tokens=c.index
            )
        )
        for c in choices
    }
    assert usage(choices, finals) == {
        "prompt_tokens": 21,
        "completion_tokens": 12,
        "total_tokens": 33,
        "prompt_tokens_details": {"cached_tokens": 0 + 2},
    }
