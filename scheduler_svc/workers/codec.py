"""The worker protocol's messages from the scheduler's plain plan and back.

The only place that knows both sides: the core builds and reads the
dataclasses of core/plan.py, the worker client sends and receives these
messages.
"""

from __future__ import annotations

from cbserve.worker.v1 import worker_pb2 as wpb
from common.sampling_params import SamplingParams
from scheduler_svc.core.plan import SampledLogprobs, StepOutput, StepPlan


def sampling_to_proto(
    sampling: SamplingParams, min_tokens_banned_ids: list[int]
) -> wpb.SequenceSampling:
    message = wpb.SequenceSampling(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        num_logprobs=sampling.logprobs,
        min_tokens=sampling.min_tokens,
        max_tokens=sampling.max_tokens,
        min_tokens_banned_ids=min_tokens_banned_ids,
    )
    if sampling.seed is not None:
        message.seed = sampling.seed
    return message


def plan_to_proto(plan: StepPlan) -> wpb.StepPlan:
    message = wpb.StepPlan(step_id=plan.step_id, finished_seq_ids=plan.finished_seq_ids)
    if plan.num_steps > 1:
        message.num_steps = plan.num_steps
    for sequence in plan.new_sequences:
        message.new_sequences.add(
            seq_id=sequence.seq_id,
            prompt_token_ids=sequence.prompt_token_ids,
            output_token_ids=sequence.output_token_ids,
            num_computed_tokens=sequence.num_computed_tokens,
            num_scheduled_tokens=sequence.num_scheduled_tokens,
            block_ids=sequence.block_ids,
            sampling=sampling_to_proto(sequence.sampling, sequence.min_tokens_banned_ids),
        )
    for sequence in plan.continuing_sequences:
        message.continuing_sequences.add(
            seq_id=sequence.seq_id,
            num_scheduled_tokens=sequence.num_scheduled_tokens,
            new_block_ids=sequence.new_block_ids,
        )
    return message


def output_from_proto(result: wpb.StepResult) -> StepOutput:
    return StepOutput(
        step_id=result.step_id,
        seq_ids=list(result.seq_ids),
        token_ids=list(result.token_ids),
        logprobs={
            entry.index: SampledLogprobs(
                logprob=entry.logprob,
                top=tuple(zip(entry.top_token_ids, entry.top_logprobs, strict=True)),
            )
            for entry in result.logprobs
        },
        forward_seconds=result.forward_seconds,
        num_tokens=result.num_tokens,
    )
