"""What one step asks of a worker, and what the worker answers: plain data.

The scheduler builds a StepPlan and takes a StepOutput; it never sees the wire
format (workers/codec.py turns these into the worker protocol's messages and
back). The plan is a diff, as vLLM's SchedulerOutput is: a sequence the worker
has not seen carries its tokens, sampling settings and block table; one it
holds carries only how many tokens to compute and its new blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.sampling_params import SamplingParams
from scheduler_svc.structured.bitmask import TokenBitmask


@dataclass
class NewSequence:
    seq_id: int
    prompt_token_ids: list[int]
    # Tokens generated before a preemption or a move: computed again, not sampled.
    output_token_ids: list[int]
    # Leading tokens whose KV the worker already holds (a prefix-cache hit).
    num_computed_tokens: int
    num_scheduled_tokens: int
    block_ids: list[int]
    # With the ids the worker must not sample while fewer than min_tokens are out
    # (SamplingParams.min_tokens_banned_ids, filled in by core/request_table.py).
    sampling: SamplingParams
    # Score the prompt positions it computes, with this many alternatives; None: no.
    prompt_logprobs: int | None = None
    # The worker's slot of its LoRA adapter (Worker.LoadAdapter); 0: the base model.
    adapter_slot: int = 0


@dataclass
class ContinuingSequence:
    seq_id: int
    num_scheduled_tokens: int
    new_block_ids: list[int] = field(default_factory=list)
    # A decode that may also verify up to this many drafts the worker proposes
    # (speculative decoding, core/speculation.py); its blocks hold room for all.
    num_draft_tokens: int = 0


@dataclass
class StepPlan:
    step_id: int
    new_sequences: list[NewSequence] = field(default_factory=list)
    continuing_sequences: list[ContinuingSequence] = field(default_factory=list)
    # Sequences the worker drops before this step (finished, aborted, preempted).
    finished_seq_ids: list[int] = field(default_factory=list)
    # Decode steps the plan covers (multi-step decoding, see multi_step.py): above 1,
    # only decodes, each sampling num_steps tokens; blocks are given for all of them.
    num_steps: int = 1
    # Allowed tokens of the constrained sequences that sample in this step
    # (structured outputs); None when there are none.
    allowed_tokens: TokenBitmask | None = None
    # Constrained sequences that sample here ahead of a pending sample: their rows
    # follow in a DeferredMasks once the result before this plan is taken.
    deferred_mask_seq_ids: list[int] = field(default_factory=list)
    # How long the worker's sampler waits for them (set by the step loop, inside the
    # step's deadline); 0: the worker's own default.
    deferred_mask_timeout_s: float = 0.0
    # (min_n, max_n) of the worker's n-gram drafts, where a sequence may draft.
    ngram_lookup: tuple[int, int] | None = None

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens the plan may have the worker compute: what its deadline scales with."""
        computed = sum(sequence.num_scheduled_tokens for sequence in self.new_sequences)
        for sequence in self.continuing_sequences:
            computed += sequence.num_scheduled_tokens + sequence.num_draft_tokens
        return self.num_steps * computed

    @property
    def is_empty(self) -> bool:
        return not (self.new_sequences or self.continuing_sequences or self.finished_seq_ids)


@dataclass(frozen=True)
class DeferredMasks:
    """The rows of a plan's deferred_mask_seq_ids, sent after the plan (worker.proto's
    deferred_allowed_tokens): those of requests that still run; the others' tokens
    are dropped, so their rows are left out and they sample unconstrained."""

    step_id: int
    allowed_tokens: TokenBitmask


@dataclass(frozen=True)
class SampledLogprobs:
    logprob: float
    # The most likely tokens, most likely first: (token_id, logprob).
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class PromptLogprobsSlice:
    """A run of one sequence's scored prompt tokens: logprobs[i] is prompt position
    first_position + i's, top[i] its most likely tokens, (token_id, logprob)."""

    first_position: int
    logprobs: list[float]
    top: list[tuple[tuple[int, float], ...]]


@dataclass
class StepOutput:
    """A step's sampled tokens: token_ids[i] for seq_ids[i] (sequences that finished
    their scheduled tokens this step; a prefill chunk that is not the last samples
    nothing). After a plan of n steps token_ids is step-major, n per sequence:
    token_ids[s * len(seq_ids) + i] is what seq_ids[i] sampled in step s."""

    step_id: int
    seq_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    # By index into token_ids, for sequences that asked for logprobs.
    logprobs: dict[int, SampledLogprobs] = field(default_factory=dict)
    # By seq_id, for sequences that asked for prompt logprobs and computed prompt
    # positions in the step.
    prompt_logprobs: dict[int, PromptLogprobsSlice] = field(default_factory=dict)
    # Time inside the worker's model runner (validate, forward, sample).
    forward_seconds: float = 0.0
    # Tokens the worker computed in the step, as it counted them.
    num_tokens: int = 0
    # Deferred rows whose mask never reached the sampler: their tokens are not taken.
    mask_missing_seq_ids: list[int] = field(default_factory=list)
    # Where sequences verified drafts: parallel to seq_ids, how many consecutive
    # token_ids each has (its accepted drafts and the token after them), and how many
    # drafts it verified. Empty: one token each, no drafts.
    token_counts: list[int] = field(default_factory=list)
    draft_counts: list[int] = field(default_factory=list)


def match_output(
    plan: StepPlan, output: StepOutput
) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
    """The plan's (seq_id, scheduled tokens) pairs, and for each sampling sequence the
    indices of its tokens in output.token_ids, one per step in order; raises
    RuntimeError for an output out of protocol."""
    num_sampling = len(output.seq_ids)
    if output.token_counts:
        sampled = _counted(output, plan)
    elif len(output.token_ids) != num_sampling * plan.num_steps:
        raise RuntimeError(
            f"step {output.step_id}: {num_sampling} sequence ids and {plan.num_steps} "
            f"steps but {len(output.token_ids)} token ids"
        )
    elif plan.num_steps == 1:  # the common case, once per sequence per step: no range()
        sampled = {seq_id: [index] for index, seq_id in enumerate(output.seq_ids)}
    else:
        sampled = {
            seq_id: list(range(index, len(output.token_ids), num_sampling))
            for index, seq_id in enumerate(output.seq_ids)
        }
    if len(sampled) != num_sampling:
        raise RuntimeError(f"step {output.step_id}: a sequence id listed twice")
    scheduled = [(s.seq_id, s.num_scheduled_tokens) for s in plan.new_sequences]
    scheduled += [(s.seq_id, s.num_scheduled_tokens) for s in plan.continuing_sequences]
    unexpected = sampled.keys() - {seq_id for seq_id, _ in scheduled}
    if unexpected:
        raise RuntimeError(
            f"step {output.step_id}: tokens for unscheduled sequences {sorted(unexpected)}"
        )
    return scheduled, sampled


def _counted(output: StepOutput, plan: StepPlan) -> dict[int, list[int]]:
    """Indices of each sequence's tokens where the worker says how many each has."""
    counts = output.token_counts
    if plan.num_steps > 1 or len(counts) != len(output.seq_ids) or min(counts) < 1:
        raise RuntimeError(
            f"step {output.step_id}: token_counts must give each of the "
            f"{len(output.seq_ids)} sequences at least one token, in a one-step plan"
        )
    if sum(counts) != len(output.token_ids) or len(output.draft_counts) != len(counts):
        raise RuntimeError(
            f"step {output.step_id}: token_counts sum to {sum(counts)} for "
            f"{len(output.token_ids)} token ids, with {len(output.draft_counts)} draft counts"
        )
    sampled, at = {}, 0
    for seq_id, count in zip(output.seq_ids, counts, strict=True):
        sampled[seq_id] = list(range(at, at + count))
        at += count
    return sampled
