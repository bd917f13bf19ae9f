"""The worker protocol's messages from the scheduler's plain plan and back.

The only place that knows both sides: the core builds and reads the
dataclasses of core/plan.py, the worker client sends and receives these
messages. A sequence's sampling settings go through common.sampling_codec.
"""

from __future__ import annotations

from cbserve.worker.v1 import worker_pb2 as wpb
from common.sampling_codec import sampling_to_worker
from scheduler_svc.core.plan import (
    DeferredMasks,
    PromptLogprobsSlice,
    SampledLogprobs,
    StepOutput,
    StepPlan,
)
from scheduler_svc.structured.bitmask import TokenBitmask


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
            sampling=sampling_to_worker(sequence.sampling),
            prompt_logprobs=sequence.prompt_logprobs,
            adapter_slot=sequence.adapter_slot,
        )
    decodes = []
    for sequence in plan.continuing_sequences:
        if (
            sequence.num_scheduled_tokens == 1
            and not sequence.new_block_ids
            and not sequence.num_draft_tokens
        ):
            decodes.append(sequence.seq_id)  # packed: common/plan_sequences.py
        else:
            message.continuing_sequences.add(
                seq_id=sequence.seq_id,
                num_scheduled_tokens=sequence.num_scheduled_tokens,
                new_block_ids=sequence.new_block_ids,
                num_draft_tokens=sequence.num_draft_tokens,
            )
    message.decode_seq_ids.extend(decodes)
    if plan.ngram_lookup is not None:
        message.ngram_lookup.min_n, message.ngram_lookup.max_n = plan.ngram_lookup
    if plan.allowed_tokens:
        _write_mask(plan.allowed_tokens, message.allowed_tokens)
    if plan.deferred_mask_seq_ids:
        message.deferred_mask_seq_ids.extend(plan.deferred_mask_seq_ids)
        message.deferred_mask_timeout_seconds = plan.deferred_mask_timeout_s
    return message


def deferred_masks_to_proto(masks: DeferredMasks) -> wpb.StepPlan:
    """The message that completes plan masks.step_id with its deferred rows."""
    message = wpb.StepPlan(step_id=masks.step_id)
    # Set even with no row: its arrival is what the worker's sampler waits for.
    message.deferred_allowed_tokens.SetInParent()
    if masks.allowed_tokens:
        _write_mask(masks.allowed_tokens, message.deferred_allowed_tokens)
    return message


def _write_mask(mask: TokenBitmask, message: wpb.TokenBitmask) -> None:
    message.seq_ids.extend(mask.seq_ids)
    message.words = mask.words
    if mask.has_drafts:  # a row per draft position somewhere: say how many each has
        message.row_counts.extend(mask.row_counts)
        message.draft_token_ids.extend(mask.draft_token_ids)


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
        prompt_logprobs={entry.seq_id: _prompt_slice(entry) for entry in result.prompt_logprobs},
        forward_seconds=result.forward_seconds,
        num_tokens=result.num_tokens,
        mask_missing_seq_ids=list(result.mask_missing_seq_ids),
        token_counts=list(result.token_counts),
        draft_counts=list(result.draft_counts),
    )


def _prompt_slice(entry: wpb.PromptLogprobs) -> PromptLogprobsSlice:
    """The flat top lists cut into one tuple per position; raises RuntimeError for a
    slice out of protocol."""
    k = entry.num_top
    if len(entry.top_token_ids) != k * len(entry.logprobs) or len(entry.top_logprobs) != len(
        entry.top_token_ids
    ):
        raise RuntimeError(
            f"prompt logprobs of sequence {entry.seq_id}: {len(entry.logprobs)} positions "
            f"with {k} alternatives each, but {len(entry.top_token_ids)} ids and "
            f"{len(entry.top_logprobs)} values"
        )
    pairs = list(zip(entry.top_token_ids, entry.top_logprobs, strict=True))
    return PromptLogprobsSlice(
        first_position=entry.first_position,
        logprobs=list(entry.logprobs),
        top=[tuple(pairs[i * k : (i + 1) * k]) for i in range(len(entry.logprobs))],
    )
