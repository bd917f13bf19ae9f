"""common.sampling_codec: SamplingParams through the client's and the worker's messages,
and the field lists that keep a new setting to the proto, the dataclass and the sampler."""

from __future__ import annotations

import dataclasses

import pytest

from cbserve.v1 import generation_pb2 as pb
from cbserve.worker.v1 import worker_pb2 as wpb
from common.errors import InvalidArgument
from common.sampling_codec import (
    WORKER_WIRE_NAMES,
    sampling_from_request,
    sampling_from_worker,
    sampling_request_from,
    sampling_to_worker,
)
from common.sampling_params import SamplingParams

# Dataclass fields that no client sends: the scheduler works them out
# (min_tokens_banned_ids when it takes a request in, for the model's EOS).
SCHEDULER_ONLY = {"min_tokens_banned_ids", "max_tokens_explicit"}
# What the worker never needs: stops are checked by the scheduler, ignore_eos is folded
# into min_tokens_banned_ids; prompt_logprobs is asked per new sequence (NewSequence),
# since a recompute after the client got them must not ask again.
NOT_FOR_THE_WORKER = {
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens_explicit",
    "prompt_logprobs",
}

FULL = SamplingParams(
    temperature=0.5,
    top_p=0.875,
    top_k=7,
    min_p=0.125,
    seed=2**63 + 5,
    max_tokens=40,
    min_tokens=3,
    stop=("END", "STOP"),
    stop_token_ids=(2, 9),
    ignore_eos=True,
    presence_penalty=0.25,
    frequency_penalty=-0.5,
    repetition_penalty=1.25,
    logprobs=4,
    prompt_logprobs=3,
)


def _names(message_class, renames=None) -> set[str]:
    renames = renames or {}
    return {renames.get(f.name, f.name) for f in message_class.DESCRIPTOR.fields}


def test_every_client_setting_is_a_dataclass_field_of_the_same_name():
    fields = {field.name for field in dataclasses.fields(SamplingParams)}
    assert _names(pb.SamplingParams) == fields - SCHEDULER_ONLY


def test_every_worker_setting_is_a_dataclass_field():
    fields = {field.name for field in dataclasses.fields(SamplingParams)}
    assert _names(wpb.SequenceSampling, WORKER_WIRE_NAMES) == fields - NOT_FOR_THE_WORKER


def test_an_empty_request_takes_the_dataclass_defaults():
    sampling = sampling_from_request(pb.SamplingParams())
    # top_k: the proto's 0 and the dataclass's -1 both mean no top-k.
    assert dataclasses.replace(sampling, top_k=-1) == SamplingParams()
    assert not sampling.uses_top_k and not sampling.max_tokens_explicit


def test_a_full_request_is_read_field_for_field():
    message = pb.SamplingParams(
        **{
            f.name: getattr(FULL, f.name)
            for f in dataclasses.fields(FULL)
            if f.name not in SCHEDULER_ONLY
        }
    )
    sampling = sampling_from_request(message)
    assert sampling == FULL
    assert sampling.max_tokens_explicit


def test_a_bad_request_value_names_its_field():
    with pytest.raises(InvalidArgument, match="sampling.top_p"):
        sampling_from_request(pb.SamplingParams(top_p=0.0))


@pytest.mark.parametrize("value", [-1, 21])
def test_prompt_logprobs_out_of_range_is_refused(value):
    with pytest.raises(InvalidArgument, match=r"sampling.prompt_logprobs.*\[0, 20\]"):
        sampling_from_request(pb.SamplingParams(prompt_logprobs=value))


def test_prompt_logprobs_zero_differs_from_unset():
    assert sampling_from_request(pb.SamplingParams()).prompt_logprobs is None
    assert sampling_from_request(pb.SamplingParams(prompt_logprobs=0)).prompt_logprobs == 0
    assert sampling_request_from({"prompt_logprobs": 0}).HasField("prompt_logprobs")
    assert not sampling_request_from({"prompt_logprobs": None}).HasField("prompt_logprobs")


def test_the_worker_gets_what_the_sampler_needs():
    message = sampling_to_worker(dataclasses.replace(FULL, min_tokens_banned_ids=(2, 9, 100)))
    assert message.num_logprobs == 4 and message.seed == FULL.seed
    assert list(message.min_tokens_banned_ids) == [2, 9, 100]
    back = sampling_from_worker(message)
    assert back == dataclasses.replace(
        FULL,
        stop=(),
        stop_token_ids=(),
        ignore_eos=False,
        prompt_logprobs=None,
        min_tokens_banned_ids=(2, 9, 100),
    )


def test_an_unseeded_request_stays_unseeded_on_the_worker():
    message = sampling_to_worker(SamplingParams())
    assert not message.HasField("seed")
    assert sampling_from_worker(message).seed is None


def test_a_plan_from_an_older_scheduler_without_max_tokens_is_read():
    message = wpb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0)
    message.min_tokens = 5
    assert sampling_from_worker(message).max_tokens == 5


def test_the_worker_refuses_a_bad_value():
    message = sampling_to_worker(SamplingParams())
    message.top_p = float("nan")
    with pytest.raises(ValueError, match="top_p"):
        sampling_from_worker(message)


def test_a_request_written_from_values_leaves_none_and_unknown_names_unset():
    message = sampling_request_from(
        {"temperature": None, "top_k": 3, "stop": ["x"], "n": 2, "max_tokens": 9}
    )
    assert not message.HasField("temperature") and message.top_k == 3
    assert list(message.stop) == ["x"] and message.max_tokens == 9
    assert sampling_from_request(message).temperature == SamplingParams().temperature
