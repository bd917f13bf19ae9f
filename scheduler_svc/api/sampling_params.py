"""The client's SamplingParams message as common.sampling_params.SamplingParams."""

from __future__ import annotations

from cbserve.v1 import generation_pb2 as pb
from common.defaults import DEFAULT_MAX_TOKENS
from common.sampling_params import SamplingParams


def sampling_from_proto(params: pb.SamplingParams) -> SamplingParams:
    """Unset optional fields take their defaults; raises InvalidArgument."""
    has = params.HasField
    return SamplingParams(
        temperature=params.temperature if has("temperature") else 1.0,
        top_p=params.top_p if has("top_p") else 1.0,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed if has("seed") else None,
        max_tokens=params.max_tokens if has("max_tokens") else DEFAULT_MAX_TOKENS,
        min_tokens=params.min_tokens,
        stop=tuple(params.stop),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty if has("repetition_penalty") else 1.0,
        logprobs=params.logprobs,
        max_tokens_explicit=has("max_tokens"),
    )
