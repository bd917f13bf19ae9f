"""A plan's per-sequence sampling settings as common.sampling_params.SamplingParams.

The scheduler validated them already; rebuilding the dataclass checks them
again, so a plan from anything else cannot put a NaN or a negative top_p
into the sampler (a ValueError here refuses the plan).
"""

from __future__ import annotations

from cbserve.worker.v1 import worker_pb2
from common.sampling_params import SamplingParams


def sampling_from_proto(message: worker_pb2.SequenceSampling) -> SamplingParams:
    return SamplingParams(
        temperature=message.temperature,
        top_p=message.top_p,
        top_k=message.top_k,
        min_p=message.min_p,
        seed=message.seed if message.HasField("seed") else None,
        # 0 from a scheduler that predates the field: as many as min_tokens asks.
        max_tokens=max(message.max_tokens, message.min_tokens, 1),
        min_tokens=message.min_tokens,
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        repetition_penalty=message.repetition_penalty,
        logprobs=message.num_logprobs,
        min_tokens_banned_ids=tuple(message.min_tokens_banned_ids),
    )
