"""A worker without a model: consumes StepPlans exactly as the protocol says.

It keeps each sequence's tokens, computed count and block table, and raises
ProtocolViolation on anything a real worker would have to reject or would
silently get wrong: unknown or duplicate sequence ids, block ids out of range,
a block table too short for the tokens to write, more tokens scheduled than a
sequence has, step ids out of order. A sequence samples a token only when its
scheduled tokens reach its end; the token comes from a script: a function of
(seq_id, output index). A plan of num_steps > 1 (multi-step decoding) must hold
decodes only; each step samples one token per sequence, which the next step
computes, into the blocks the plan gave.

It also models the KV pool's contents, so that prefix caching and recompute
are checkable. The KV written at a position depends on the token there and
on every token before it (attention), so each slot records that context
(`SlotKV`). A step that computes positions [computed, end) of a sequence
writes them into its blocks; before that, the sequence's positions
[0, computed) must hold exactly its own context, whether a previous step of
it wrote them or they came from the prefix cache (a sequence that arrives
with num_computed_tokens > 0). A block held by several live sequences is
shared KV: writing into it would corrupt the others, so that is a violation.

A decode given num_draft_tokens (speculative decoding) verifies the drafts of
`drafter` (seq_id, output index, room) -> draft ids, if one is set: it writes their
KV (rejected ones leave stale slots, which any later read catches), emits the
script's tokens while they equal the drafts and one more, and reports the counts.

Masks of allowed tokens (structured outputs), in the plan or deferred after it, are
checked and applied as the protocol says (fake_masks.py); a masked row samples the
script's token if the mask allows it, else the first allowed one.

A sequence that asks for prompt logprobs gets, for each prompt token its step's
positions score, fake_prompt_logprob(position) and alternatives of its token id +
rank, as a real worker's slices come.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cbserve.worker.v1 import worker_pb2 as wpb
from common.plan_sequences import continuing_sequences
from scheduler_svc.core.plan import DeferredMasks, StepOutput, StepPlan
from scheduler_svc.workers.codec import deferred_masks_to_proto, output_from_proto, plan_to_proto

from .fake_drafting import FakeDrafting
from .fake_kv import SlotKV, contexts_of
from .fake_masks import FakeMasking

# (seq_id, index of the output token to sample) -> token id
TokenScript = Callable[[int, int], int]


class ProtocolViolation(AssertionError):
    pass


@dataclass
class FakeSequence:
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_logprobs: int
    num_computed_tokens: int = 0
    sampled: list[int] = field(default_factory=list)
    prompt_logprobs: int | None = None


def fake_prompt_logprob(position: int) -> float:
    """The logprob the fake worker gives the prompt token at `position` (exact in float32)."""
    return -position / 8


def scripted(
    by_seq_id: Mapping[int, Sequence[int]], default: TokenScript | None = None
) -> TokenScript:
    """Given token lists per sequence, falling back to `default` (or token 42)."""

    def next_token(seq_id: int, index: int) -> int:
        tokens = by_seq_id.get(seq_id, ())
        if index < len(tokens):
            return tokens[index]
        return default(seq_id, index) if default else 42

    return next_token


class FakeWorker(FakeDrafting, FakeMasking):
    def __init__(self, num_blocks: int, block_size: int, script: TokenScript) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.script = script
        self.sequences: dict[int, FakeSequence] = {}
        self.last_step_id = 0
        self.plans: list[wpb.StepPlan] = []
        # The pool: kv[block_id][offset]; None until something is written there.
        self.kv: list[list[SlotKV | None]] = [[None] * block_size for _ in range(num_blocks)]
        # Slots written so far, for tests that want to see what was (re)computed.
        self.num_slots_written = 0
        self.drafter = None  # fake_drafting.Drafter
        # This step's masked sequences with a row per draft position: (allowed ids of
        # each row, the drafts the rows follow).
        self.draft_masks: dict[int, tuple[list[np.ndarray], list[int]]] = {}
        # Every such mask: (seq_id, its output before the step, its rows, their drafts).
        self.draft_mask_log: list[tuple[int, list[int], np.ndarray, list[int]]] = []
        # Every drafting decode: (seq_id, its drafts, tokens emitted, the allowed ids of
        # each position it could emit, None if free).
        self.draft_log: list[tuple[int, list[int], int, list | None]] = []

    def step(self, plan: StepPlan, masks: DeferredMasks | None = None) -> StepOutput:
        """Runs a scheduler's plan (and its deferred masks, if they came) through the
        wire format, as a real worker gets them."""
        deferred = deferred_masks_to_proto(masks) if masks is not None else None
        return output_from_proto(self.step_proto(plan_to_proto(plan), deferred))

    def step_proto(
        self, plan: wpb.StepPlan, deferred: wpb.StepPlan | None = None
    ) -> wpb.StepResult:
        """`deferred`: the message with the plan's deferred masks; rows it lacks sample
        unconstrained and are reported missing, as a real worker's that waited in vain."""
        self.plans.append(plan)
        self._check(plan.step_id > self.last_step_id, f"step {plan.step_id} out of order")
        self.last_step_id = plan.step_id
        for seq_id in plan.finished_seq_ids:
            self._check(seq_id in self.sequences, f"finishing unknown sequence {seq_id}")
            del self.sequences[seq_id]
        scheduled: list[tuple[int, int]] = []
        for new in plan.new_sequences:
            self._check(new.seq_id not in self.sequences, f"sequence {new.seq_id} already held")
            self._check_blocks(new.block_ids)
            self.sequences[new.seq_id] = FakeSequence(
                token_ids=[*new.prompt_token_ids, *new.output_token_ids],
                num_prompt_tokens=len(new.prompt_token_ids),
                block_ids=list(new.block_ids),
                num_logprobs=new.sampling.num_logprobs,
                num_computed_tokens=new.num_computed_tokens,
                sampled=list(new.output_token_ids),
                prompt_logprobs=new.prompt_logprobs if new.HasField("prompt_logprobs") else None,
            )
            scheduled.append((new.seq_id, new.num_scheduled_tokens))
        for seq_id, num_scheduled, new_block_ids in continuing_sequences(plan):
            self._check(seq_id in self.sequences, f"unknown sequence {seq_id}")
            self._check_blocks(new_block_ids)
            self.sequences[seq_id].block_ids.extend(new_block_ids)
            scheduled.append((seq_id, num_scheduled))
        seq_ids = [seq_id for seq_id, _ in scheduled]
        self._check(len(set(seq_ids)) == len(seq_ids), f"a sequence twice in step {plan.step_id}")
        holders = self._holders()
        result = wpb.StepResult(step_id=plan.step_id)
        self.draft_masks = {}
        for seq_id, n in scheduled:
            self._score_prompt(seq_id, n, result)
        sampling = [seq_id for seq_id, n in scheduled if self._compute(seq_id, n, holders)]
        result.seq_ids.extend(sampling)
        num_steps = max(plan.num_steps, 1)
        if num_steps > 1:
            # Multi-step: decodes only, all of which sample in every step.
            self._check(not plan.new_sequences, "new sequences in a multi-step plan")
            self._check(
                len(sampling) == len(scheduled) and all(n == 1 for _, n in scheduled),
                f"step {plan.step_id}: a multi-step plan with a sequence that is not a decode",
            )
        allowed = self._masks_of_step(plan, deferred, sampling, result)
        room = self._draft_room(plan, sampling)
        verified: dict[int, tuple[int, int]] = {}
        for step in range(num_steps):
            if step:  # each step computes the token the one before sampled
                for seq_id in sampling:
                    self._check(self._compute(seq_id, 1, holders), "a decode that did not sample")
            for seq_id in sampling:
                if seq_id in room:
                    masks = self._position_masks(seq_id, allowed)
                    verified[seq_id] = self._verify(seq_id, room[seq_id], result, holders, masks)
                else:
                    self._sample(seq_id, result, allowed.get(seq_id))
        result.num_tokens = sum(n for _, n in scheduled) + (num_steps - 1) * len(sampling)
        if room:
            for seq_id in result.seq_ids:
                count, num_drafts = verified.get(seq_id, (1, 0))
                result.token_counts.append(count)
                result.draft_counts.append(num_drafts)
                result.num_tokens += num_drafts
        return result

    def _holders(self) -> Counter[int]:
        """How many live sequences hold each block; a table never holds one twice."""
        holders: Counter[int] = Counter()
        for seq_id, seq in self.sequences.items():
            self._check(
                len(set(seq.block_ids)) == len(seq.block_ids),
                f"sequence {seq_id} holds a block twice: {seq.block_ids}",
            )
            holders.update(seq.block_ids)
        return holders

    def _compute(self, seq_id: int, num_scheduled: int, holders: Counter[int]) -> bool:
        """Writes the KV of the scheduled tokens; whether the sequence samples now."""
        seq = self.sequences[seq_id]
        start = seq.num_computed_tokens
        end = start + num_scheduled
        self._check(num_scheduled >= 1, f"sequence {seq_id}: nothing scheduled")
        self._check(
            end <= len(seq.token_ids),
            f"sequence {seq_id}: {end} tokens scheduled, it has {len(seq.token_ids)}",
        )
        self._check(
            end <= len(seq.block_ids) * self.block_size,
            f"sequence {seq_id}: {len(seq.block_ids)} blocks cannot hold {end} tokens",
        )
        contexts = contexts_of(seq.token_ids[:end])
        # Attention reads every earlier position: it must be this sequence's KV.
        for position in range(start):
            found = self._slot(seq, position)
            self._check(
                found == SlotKV(seq.token_ids[position], position, contexts[position]),
                f"sequence {seq_id}: position {position} (block "
                f"{seq.block_ids[position // self.block_size]}) holds {found}, not its own KV",
            )
        for position in range(start, end):
            block_id = seq.block_ids[position // self.block_size]
            self._check(
                holders[block_id] == 1,
                f"sequence {seq_id} writes position {position} into block {block_id}, "
                f"which {holders[block_id]} live sequences share",
            )
            self.kv[block_id][position % self.block_size] = SlotKV(
                seq.token_ids[position], position, contexts[position]
            )
            self.num_slots_written += 1
        seq.num_computed_tokens = end
        return end == len(seq.token_ids)

    def _score_prompt(self, seq_id: int, num_scheduled: int, result: wpb.StepResult) -> None:
        seq = self.sequences[seq_id]
        start = seq.num_computed_tokens
        scored_end = min(start + num_scheduled, seq.num_prompt_tokens - 1)
        if seq.prompt_logprobs is None or scored_end <= start:
            return
        entry = result.prompt_logprobs.add(
            seq_id=seq_id, first_position=start + 1, num_top=seq.prompt_logprobs
        )
        for position in range(start + 1, scored_end + 1):
            entry.logprobs.append(fake_prompt_logprob(position))
            for rank in range(seq.prompt_logprobs):
                entry.top_token_ids.append(seq.token_ids[position] + rank)
                entry.top_logprobs.append(-float(rank))

    def _sample(self, seq_id: int, result: wpb.StepResult, allowed: np.ndarray | None) -> int:
        seq = self.sequences[seq_id]
        token_id = self.script(seq_id, len(seq.sampled))
        if allowed is not None and token_id not in allowed:
            # As the real sampler: the script's token is masked out, take an allowed one.
            self._check(len(allowed) > 0, f"sequence {seq_id}: a mask that allows nothing")
            token_id = int(allowed[0])
        seq.sampled.append(token_id)
        seq.token_ids.append(token_id)
        index = len(result.token_ids)  # step-major: all of step s, then all of step s + 1
        result.token_ids.append(token_id)
        if seq.num_logprobs:
            top = [token_id + rank for rank in range(seq.num_logprobs)]
            result.logprobs.add(
                index=index,
                logprob=-0.5,
                top_token_ids=top,
                top_logprobs=[-0.5 - rank for rank in range(len(top))],
            )
        return token_id

    def _slot(self, seq: FakeSequence, position: int) -> SlotKV | None:
        return self.kv[seq.block_ids[position // self.block_size]][position % self.block_size]

    def _check_blocks(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            self._check(0 <= block_id < self.num_blocks, f"block {block_id} out of range")

    @staticmethod
    def _check(condition: bool, message: str) -> None:
        if not condition:
            raise ProtocolViolation(message)
