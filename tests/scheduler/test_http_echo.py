"""/v1/completions' echo and prompt logprobs without a stack: what the translation asks
of the scheduler, and the OpenAI legacy and vLLM shapes built from GenerateResponses."""

from __future__ import annotations

import math

import pytest

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.completions import CompletionShaper
from scheduler_svc.api.http.protocol import CompletionRequest
from scheduler_svc.api.http.translate import completion_requests, scores_prompt_only

TEXTS = {5: "A", 6: " b", 7: " c", 8: "!", 9: "?"}


def _sampling(**fields) -> pb.SamplingParams:
    [choice] = completion_requests(CompletionRequest(prompt="A b c", **fields), "id")
    return choice.request.sampling


def test_echo_with_logprobs_asks_for_the_prompts_logprobs_too():
    sampling = _sampling(echo=True, logprobs=2)
    assert sampling.prompt_logprobs == 2 and sampling.logprobs == 2
    assert not _sampling(echo=True).HasField("prompt_logprobs")
    assert not _sampling(logprobs=2).HasField("prompt_logprobs")
    assert _sampling(prompt_logprobs=0).prompt_logprobs == 0
    assert _sampling(echo=True, logprobs=1, prompt_logprobs=4).prompt_logprobs == 4


def test_max_tokens_zero_with_echo_scores_the_prompt_and_samples_one_dropped_token():
    body = CompletionRequest(prompt="A b c", echo=True, logprobs=1, max_tokens=0)
    assert scores_prompt_only(body) and _sampling(echo=True, max_tokens=0).max_tokens == 1
    # Without echo, 0 goes on to the one request path, which refuses it.
    assert _sampling(max_tokens=0).max_tokens == 0


def _entry(token_id: int, logprob: float, *tops: tuple[int, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=token_id,
        logprob=logprob,
        top_logprobs=[pb.TopLogprob(token_id=t, logprob=v, token=TEXTS[t]) for t, v in tops],
    )


PROMPT_SCORES = [
    _entry(5, math.nan),
    _entry(6, -1.5, (7, -0.5), (6, -1.5)),
    _entry(7, -0.25, (7, -0.25), (8, -2.0)),
]
FIRST = pb.GenerateResponse(
    text="!", token_ids=[8], logprobs=[_entry(8, -0.75, (8, -0.75), (9, -1.0))]
)
FIRST.prompt_logprobs.extend(PROMPT_SCORES)
LAST = pb.GenerateResponse(
    text="?", token_ids=[9], logprobs=[_entry(9, -0.5, (9, -0.5), (8, -3.0))],
    finish_reason=pb.LENGTH, usage=pb.Usage(prompt_tokens=3, completion_tokens=2),
)  # fmt: skip


def _shaper(body: CompletionRequest) -> CompletionShaper:
    return CompletionShaper(
        "id",
        "model",
        completion_requests(body, "id"),
        TEXTS.__getitem__,
        body.logprobs,
        echo=body.echo,
        prompt_only=scores_prompt_only(body),
        prompt_logprobs=body.prompt_logprobs,
        decode=lambda ids: "".join(TEXTS[i] for i in ids),
    )


def test_echo_puts_the_scored_prompt_before_the_completion():
    body = CompletionRequest(prompt="A b c", echo=True, logprobs=1, max_tokens=2)
    [choice] = _shaper(body).response({0: [FIRST, LAST]})["choices"]
    assert choice["text"] == "A b c!?"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["A", " b", " c", "!", "?"]
    assert logprobs["token_logprobs"] == [None, -1.5, -0.25, -0.75, -0.5]
    assert logprobs["top_logprobs"] == [
        None,
        {" c": -0.5},
        {" c": -0.25},
        {"!": -0.75},
        {"?": -0.5},
    ]
    assert logprobs["text_offset"] == [0, 1, 3, 5, 6]


def test_max_tokens_zero_answers_the_prompt_alone_with_no_completion_tokens():
    body = CompletionRequest(prompt=[5, 6, 7], echo=True, logprobs=1, max_tokens=0)
    only = pb.GenerateResponse()
    only.CopyFrom(FIRST)
    only.finish_reason, only.usage.prompt_tokens, only.usage.completion_tokens = pb.LENGTH, 3, 1
    body_out = _shaper(body).response({0: [only]})
    [choice] = body_out["choices"]
    assert choice["text"] == "A b c"  # token-id prompts are decoded
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -0.25]
    assert choice["finish_reason"] == "length"
    assert body_out["usage"]["completion_tokens"] == 0 and body_out["usage"]["total_tokens"] == 3


def test_a_stream_echoes_in_its_first_chunk_only():
    body = CompletionRequest(prompt="A b c", echo=True, logprobs=0, stream=True, max_tokens=2)
    shaper = _shaper(body)
    [first] = shaper.chunk_choices(0, FIRST, first=True)
    [last] = shaper.chunk_choices(0, LAST, first=False)
    assert first["text"] == "A b c!" and last["text"] == "?"
    assert first["logprobs"]["token_logprobs"] == [None, -1.5, -0.25, -0.75]
    assert first["logprobs"]["top_logprobs"][1] == {}  # logprobs 0: no alternatives
    assert last["logprobs"]["text_offset"] == [6]


def test_vllms_prompt_logprobs_shape():
    body = CompletionRequest(prompt="A b c", prompt_logprobs=1, max_tokens=2)
    [choice] = _shaper(body).response({0: [FIRST, LAST]})["choices"]
    assert choice["text"] == "!?" and choice["logprobs"] is None
    none, second, third = choice["prompt_logprobs"]
    assert none is None
    # The prompt token first when it is not among the alternatives.
    assert second == {
        "6": {"logprob": -1.5, "decoded_token": " b"},
        "7": {"logprob": -0.5, "rank": 1, "decoded_token": " c"},
    }
    assert third == {"7": {"logprob": -0.25, "rank": 1, "decoded_token": " c"}}


@pytest.mark.parametrize("fields", [{"logprobs": 1}, {}])
def test_without_echo_the_completion_shape_is_unchanged(fields):
    body = CompletionRequest(prompt="A b c", max_tokens=2, **fields)
    [choice] = _shaper(body).response({0: [FIRST, LAST]})["choices"]
    assert choice["text"] == "!?" and "prompt_logprobs" not in choice
    if fields:
        assert choice["logprobs"]["tokens"] == ["!", "?"]
        assert choice["logprobs"]["text_offset"] == [0, 1]
