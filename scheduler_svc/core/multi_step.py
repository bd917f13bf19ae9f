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

The scheduler takes the tokens one step at a time (`_take_tokens`, for
one-step plans too), as n one-step plans would have given them:
num_computed_tokens advances by one per token taken, and full blocks are
registered in the prefix cache as they fill, so every invariant of a one-step
plan holds after a multi-step one. Part of Scheduler (a mixin): it works on
its queues, block tables and output processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.plan import SampledLogprobs, StepOutput, StepPlan
from scheduler_svc.core.request import Request, RequestOutput, TokenLogprob

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler


class MultiStepMixin:
    def _plan_decode_steps(self: Scheduler, plan: StepPlan) -> None:
        """Turns a decode-only one-step plan into one of up to num_scheduler_steps steps
        (in place); leaves it as it is unless every running request is in it as a decode."""
        max_steps = self.config.num_scheduler_steps
        if max_steps < 2 or plan.new_sequences or not plan.continuing_sequences:
            return
        if len(plan.continuing_sequences) != len(self.running):
            return  # someone waits for a turn: a prefill chunk, or a decode past the budget
        by_seq_id = {request.seq_id: request for request in self.running}
        requests = []
        for sequence in plan.continuing_sequences:
            request = by_seq_id.get(sequence.seq_id)
            # A decode computes the last token the request has, all before it computed.
            if request is None or sequence.num_scheduled_tokens != 1:
                return
            if request.num_computed_tokens + 1 != request.num_tokens:
                return
            requests.append(request)
        num_steps = min(max_steps, *(_room(request, self.max_model_len) for request in requests))
        # Fewer steps when the free blocks do not hold them all: never preempt for a lookahead.
        blocks = self.block_manager
        while (
            num_steps > 1 and _blocks_missing(requests, blocks, num_steps) > blocks.num_free_blocks
        ):
            num_steps -= 1
        if num_steps < 2:
            return
        for sequence, request in zip(plan.continuing_sequences, requests, strict=True):
            end = request.num_computed_tokens + num_steps
            sequence.new_block_ids.extend(blocks.append_slots(request.seq_id, end))
        plan.num_steps = num_steps

    def _take_tokens(
        self: Scheduler, request: Request, indices: Sequence[int], result: StepOutput
    ) -> RequestOutput:
        """Takes a request's tokens of a step (one per step of its plan, at these indices of
        result.token_ids) in order, up to the one that finishes it; one output for all.

        The scheduled tokens of the first step are already counted as computed.
        """
        outputs: list[RequestOutput] = []
        for index in indices:
            if outputs:  # this step computed the token the one before sampled
                request.num_computed_tokens += 1
                self.block_manager.cache_computed_blocks(request)
            token_id = result.token_ids[index]
            request.output_token_ids.append(token_id)
            request.sampled_since_admission = True
            logprob = _token_logprob(request, token_id, result.logprobs.get(index))
            output = self._processors[request.request_id].process_token(request, logprob)
            outputs.append(output)
            if output.finish_reason is not None:
                self._finish(request, output.finish_reason)
                break  # the tokens after it were sampled past its end: never streamed
        return merge_outputs(outputs)


def _room(request: Request, max_model_len: int) -> int:
    """Tokens the request may still sample before max_tokens or the model length."""
    return min(
        request.sampling.max_tokens - request.num_output_tokens,
        max_model_len - request.num_tokens,
    )


def _blocks_missing(requests: Sequence[Request], blocks: BlockManager, num_steps: int) -> int:
    # n steps compute the last token and the n - 1 first ones sampled: KV up to computed + n.
    return sum(
        blocks.num_missing_blocks(request.seq_id, request.num_computed_tokens + num_steps)
        for request in requests
    )


def _token_logprob(
    request: Request, token_id: int, entry: SampledLogprobs | None
) -> TokenLogprob | None:
    if entry is None or request.sampling.logprobs == 0:
        return None
    return TokenLogprob(token_id=token_id, logprob=entry.logprob, top=entry.top)


def merge_outputs(outputs: Sequence[RequestOutput]) -> RequestOutput:
    """One request's outputs of consecutive steps as one delta (the client gets fewer,
    larger messages; the last one carries the finish reason and the usage)."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    return RequestOutput(
        request_id=last.request_id,
        new_token_ids=[token_id for output in outputs for token_id in output.new_token_ids],
        new_text="".join(output.new_text for output in outputs),
        logprobs=[entry for output in outputs for entry in output.logprobs],
        finish_reason=last.finish_reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_prompt_tokens=last.cached_prompt_tokens,
    )
