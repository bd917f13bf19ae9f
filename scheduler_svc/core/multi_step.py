"""Multi-step decoding: one plan covers several decode steps (vLLM's multi-step).

On a CPU a decode step of a small model takes a few milliseconds, so the
scheduler-worker round trip (schedule, gRPC both ways, postprocess) is a large
share of every token. With `num_scheduler_steps` K > 1, a step in which every
running request is a decode (one token each, the last one it has; nothing
admitted, no prefill chunk, nobody left out for lack of budget) becomes a plan
of n <= K steps that the worker runs back to back, sampling one token per
sequence per step and computing it in the next.

n is also bounded by what every sequence may still generate (max_tokens, the
model length): no sequence is asked for a token its limits forbid, so the
only early ends are stops (EOS, a stop token id, a stop string). A request
that stops at its i-th token keeps the first i and the rest is dropped
unseen; it is finished as any other (blocks freed, the worker told).

Blocks for the n computed tokens are taken from the free blocks only: the
lookahead never preempts anyone (the preemption rules of admission.py stay
as they are, applied one token at a time by the next plans). When the free
blocks do not cover n steps, fewer are planned, down to one.

A plan with a constrained request (structured outputs) stays one step: its mask
for a token needs the token before, which only the scheduler's matcher can say.

A free function over the plan, the running requests and the block manager:
the scheduler calls it on a one-step plan it has just built (so each decode
already counts its first computed token and one pending sample) and takes the
tokens one step at a time when the result comes (token_intake.take_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.plan import StepPlan
from scheduler_svc.core.request import Request


def plan_decode_steps(
    plan: StepPlan,
    running: Sequence[Request],
    blocks: BlockManager,
    max_steps: int,
    max_model_len: int,
) -> None:
    """Turns a decode-only one-step plan into one of up to max_steps steps (in place);
    leaves it as it is unless every running request is in it as a plain decode."""
    if max_steps < 2 or plan.new_sequences or not plan.continuing_sequences:
        return
    if len(plan.continuing_sequences) != len(running):
        return  # someone waits for a turn: a prefill chunk, or a decode past the budget
    by_seq_id = {request.seq_id: request for request in running}
    requests = []
    for sequence in plan.continuing_sequences:
        request = by_seq_id.get(sequence.seq_id)
        # A plain decode: its one scheduled token is the last it has, and the sample
        # this plan asks for is the only one pending.
        if request is None or sequence.num_scheduled_tokens != 1 or sequence.num_draft_tokens:
            return
        if request.num_pending_samples != 1 or request.num_computed_tokens != request.num_tokens:
            return
        if request.structured is not None:
            return  # its next mask needs this step's token: one step per plan
        requests.append(request)
    # This plan's own sample is pending already: n may be one more than the room left.
    num_steps = min(max_steps, *(room_to_sample(r, max_model_len) + 1 for r in requests))
    # Fewer steps when the free blocks do not hold them all: never preempt for a lookahead.
    while num_steps > 1 and _blocks_missing(requests, blocks, num_steps) > blocks.num_free_blocks:
        num_steps -= 1
    if num_steps < 2:
        return
    for sequence, request in zip(plan.continuing_sequences, requests, strict=True):
        # Steps 2..n compute the tokens steps 1..n-1 sample, and each samples one more.
        request.num_computed_tokens += num_steps - 1
        request.num_pending_samples += num_steps - 1
        new_block_ids = blocks.append_slots(request.seq_id, request.num_computed_tokens)
        sequence.new_block_ids.extend(new_block_ids)
    plan.num_steps = num_steps


def room_to_sample(request: Request, max_model_len: int) -> int:
    """Tokens the request may still be asked to sample before max_tokens or the model
    length ends it, counting the samples of plans in flight as taken."""
    pending = request.num_pending_samples
    return min(
        request.sampling.max_tokens - request.num_output_tokens - pending,
        max_model_len - request.num_tokens - pending,
    )


def _blocks_missing(requests: Sequence[Request], blocks: BlockManager, num_steps: int) -> int:
    # n steps compute the last token and the n - 1 first ones sampled: KV up to
    # computed + n - 1 (computed already counts the first).
    return sum(
        blocks.num_missing_blocks(request.seq_id, request.num_computed_tokens + num_steps - 1)
        for request in requests
    )
