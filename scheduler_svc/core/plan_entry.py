"""Adding one request to the plan being built: its blocks, its counts, its entry.

What a request's entry says depends on what the worker holds: a sequence the worker
has not seen carries its tokens, sampling settings and whole block table (NewSequence);
one it holds carries only its token count, its new blocks and the drafts it may verify
(ContinuingSequence). Either way the scheduler counts the tokens as computed when
planned and the token the plan samples as pending (async scheduling: the next plan is
built before this one's result), drafts as if every one will be accepted
(core/speculation.py settles that when the result comes), and a constrained request
that samples gets its allowed-token row now, or in a message after the result before
this plan (pending_masks.py); one with drafts gets a row per position
(structured/draft_masks.py).
"""

from __future__ import annotations

from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.plan import ContinuingSequence, NewSequence, StepPlan
from scheduler_svc.core.prompt_logprobs import prompt_logprobs_to_ask
from scheduler_svc.core.request import Request
from scheduler_svc.structured.scheduling import add_allowed_tokens


def add_to_plan(
    request: Request,
    num_scheduled: int,
    plan: StepPlan,
    blocks: BlockManager,
    drafts: int = 0,
    ngram_lookup: tuple[int, int] | None = None,
    adapter_slot: int = 0,
) -> bool:
    """Plans num_scheduled tokens (and `drafts` drafts) of the request; returns whether
    it samples in this plan. Its blocks must have been secured (can_append_slots);
    adapter_slot: the worker's slot of its LoRA adapter (0: the base)."""
    end = request.num_computed_tokens + num_scheduled
    samples = end == request.num_planned_tokens
    end += drafts
    new_block_ids = blocks.append_slots(request.seq_id, end)
    request.num_computed_tokens = end
    if samples:
        ahead = request.num_pending_samples > 0
        request.num_pending_samples += 1 + drafts
        if request.structured is None:
            pass
        elif ahead:
            plan.deferred_mask_seq_ids.append(request.seq_id)  # take_deferred_masks
        else:
            add_allowed_tokens(plan, request, drafts, ngram_lookup)
    if request.seen_by_worker:
        plan.continuing_sequences.append(
            ContinuingSequence(request.seq_id, num_scheduled, list(new_block_ids), drafts)
        )
        if drafts:
            plan.ngram_lookup = ngram_lookup
        return samples
    plan.new_sequences.append(
        NewSequence(
            seq_id=request.seq_id,
            prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids),
            num_computed_tokens=end - num_scheduled,
            num_scheduled_tokens=num_scheduled,
            block_ids=list(blocks.block_table(request.seq_id)),
            sampling=request.sampling,
            prompt_logprobs=prompt_logprobs_to_ask(request),
            adapter_slot=adapter_slot,
        )
    )
    request.seen_by_worker = True
    return samples
