"""Reads a StepPlan once into a Step, checking it against the worker's state.

A plan that contradicts what the worker holds (an unknown or twice-listed sequence,
a token outside the vocabulary, a block outside the pool, more tokens scheduled than
a sequence has or its blocks can hold, a multi-step plan with anything but decodes,
a malformed mask) is refused whole with a PlanError, which the server answers with
INVALID_ARGUMENT: nothing changes before the whole plan has been read, so the worker
is left exactly as it was.

This is the worker's one reader of the wire's plan, as the scheduler's
workers/codec.py is its one writer: checks and conversion walk each field once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cbserve.worker.v1 import worker_pb2 as wpb
from common.sampling_codec import sampling_from_worker
from common.sampling_params import MAX_LOGPROBS
from worker_svc.errors import PlanError
from worker_svc.kv_pool import KVPool
from worker_svc.sequence import SequenceState
from worker_svc.step.description import (
    NO_MASKS,
    ContinuingSequence,
    NewSequence,
    NgramLookup,
    Step,
)
from worker_svc.token_bitmask import DraftRows, read_mask

if TYPE_CHECKING:
    import numpy as np

    from worker_svc.lora.slots import LoraSlots


@dataclass(frozen=True)
class PlanReader:
    """What every plan is checked against: the model's vocabulary and length, the pool."""

    vocab_size: int
    max_model_len: int
    pool: KVPool
    # The LoRA slot store (worker_svc/lora/slots.py); None: a worker without --enable-lora.
    lora_slots: LoraSlots | None = None

    def read(self, plan: wpb.StepPlan, held: Mapping[int, SequenceState]) -> Step:
        """The plan as a Step; raises PlanError. `held`: the sequences the worker holds."""
        num_steps = max(plan.num_steps, 1)
        if num_steps > 1 and plan.new_sequences:
            raise PlanError(f"a plan of {num_steps} steps has new sequences: decodes only")
        finished = tuple(plan.finished_seq_ids)
        gone = frozenset(finished)
        listed: set[int] = set()
        new = tuple(self._new(message, held, gone, listed) for message in plan.new_sequences)
        # Each step after the first computes the token the one before sampled.
        lookahead = num_steps - 1
        continuing = []
        for message in plan.continuing_sequences:
            sid, num_scheduled = message.seq_id, message.num_scheduled_tokens
            seq = self._held(sid, held, gone, listed)
            new_block_ids = tuple(message.new_block_ids)
            self._check_block_ids(sid, new_block_ids)
            drafts = message.num_draft_tokens
            if drafts:
                self._check_drafting(seq, num_scheduled, num_steps)
            self._check_continuing(seq, num_scheduled, len(new_block_ids), lookahead + drafts)
            continuing.append(ContinuingSequence(sid, num_scheduled, new_block_ids, drafts))
        decodes = tuple(plan.decode_seq_ids)
        for sid in decodes:
            self._check_continuing(self._held(sid, held, gone, listed), 1, 0, lookahead)
        mask = plan.allowed_tokens
        masked = mask.seq_ids or mask.words
        allowed, draft_rows = self._masks(mask, num_steps, listed) if masked else (NO_MASKS, {})
        deferred = self._deferred(plan, num_steps, listed, allowed)
        lookup = self._ngram_lookup(plan, continuing, draft_rows)
        return Step(
            step_id=plan.step_id,
            num_steps=num_steps,
            finished_seq_ids=finished,
            new_sequences=new,
            continuing_sequences=tuple(continuing),
            decode_seq_ids=decodes,
            allowed_tokens=allowed,
            allowed_draft_rows=draft_rows or NO_MASKS,
            deferred_mask_seq_ids=deferred,
            deferred_mask_timeout_s=max(plan.deferred_mask_timeout_seconds, 0.0),
            ngram_lookup=lookup,
        )

    def _new(
        self, message: wpb.NewSequence, held: Mapping, gone: Collection[int], listed: set[int]
    ) -> NewSequence:
        sid = message.seq_id
        if sid in listed or (sid in held and sid not in gone):
            raise PlanError(f"new sequence {sid} is already held or listed twice")
        listed.add(sid)
        prompt = tuple(message.prompt_token_ids)
        if not prompt:
            raise PlanError(f"new sequence {sid} has no prompt tokens")
        output = tuple(message.output_token_ids)
        self._check_token_ids(sid, prompt)
        self._check_token_ids(sid, output)
        block_ids = tuple(message.block_ids)
        self._check_block_ids(sid, block_ids)
        computed, scheduled = message.num_computed_tokens, message.num_scheduled_tokens
        self._check_extent(sid, computed, scheduled, len(prompt) + len(output), len(block_ids))
        prompt_logprobs = None
        if message.HasField("prompt_logprobs"):
            prompt_logprobs = message.prompt_logprobs
            if prompt_logprobs > MAX_LOGPROBS:
                raise PlanError(
                    f"sequence {sid}: prompt_logprobs {prompt_logprobs} is over {MAX_LOGPROBS}"
                )
        try:
            sampling = sampling_from_worker(message.sampling)
        except ValueError as exc:
            raise PlanError(f"sequence {sid}: {exc}") from None
        slot = message.adapter_slot
        if slot:
            self._check_adapter_slot(sid, slot)
        return NewSequence(
            sid, prompt, output, computed, scheduled, block_ids, sampling, prompt_logprobs, slot
        )

    def _check_adapter_slot(self, sid: int, slot: int) -> None:
        if self.lora_slots is None:
            raise PlanError(
                f"sequence {sid}: adapter slot {slot} on a worker started without --enable-lora"
            )
        if not self.lora_slots.is_loaded(slot):
            raise PlanError(
                f"sequence {sid}: adapter slot {slot} holds no adapter "
                f"(slots 1..{self.lora_slots.num_slots - 1}; LoadAdapter first)"
            )

    def _held(
        self, sid: int, held: Mapping[int, SequenceState], gone: Collection[int], listed: set[int]
    ) -> SequenceState:
        if sid in listed:
            raise PlanError(f"sequence {sid} is listed twice")
        listed.add(sid)
        seq = held.get(sid)
        if seq is None or sid in gone:
            raise PlanError(f"unknown sequence {sid}: not held by this worker on this stream")
        return seq

    def _check_continuing(
        self, seq: SequenceState, num_scheduled: int, num_new_blocks: int, lookahead: int
    ) -> None:
        if lookahead and not (num_scheduled == 1 and seq.num_computed_tokens + 1 == seq.num_tokens):
            raise PlanError(
                f"sequence {seq.seq_id}: a plan of {lookahead + 1} steps must only hold decodes"
            )
        self._check_extent(
            seq.seq_id,
            seq.num_computed_tokens,
            num_scheduled,
            seq.num_tokens,
            len(seq.block_ids) + num_new_blocks,
            lookahead,
        )

    @staticmethod
    def _check_drafting(seq: SequenceState, num_scheduled: int, num_steps: int) -> None:
        """Drafts follow the token a decode computes: one step, one token, the last."""
        if num_steps > 1 or num_scheduled != 1 or seq.num_computed_tokens + 1 != seq.num_tokens:
            raise PlanError(
                f"sequence {seq.seq_id}: num_draft_tokens needs a one-step plan in which it "
                "decodes (one scheduled token, the last it has)"
            )

    @staticmethod
    def _ngram_lookup(
        plan: wpb.StepPlan, continuing: list[ContinuingSequence], draft_rows: Mapping
    ) -> NgramLookup | None:
        """The plan's lookup where it has drafts. A constrained sequence's rows past its
        first need that many drafts it may verify."""
        room = {c.seq_id: c.num_draft_tokens for c in continuing if c.num_draft_tokens}
        for sid, rows in draft_rows.items():
            if len(rows.drafts) > room.get(sid, 0):
                raise PlanError(
                    f"allowed_tokens: sequence {sid} has {len(rows.rows)} rows but may "
                    f"verify {room.get(sid, 0)} drafts"
                )
        if not room:
            return None
        lookup = plan.ngram_lookup
        if not 1 <= lookup.min_n <= lookup.max_n:
            raise PlanError(
                f"num_draft_tokens needs ngram_lookup with 1 <= min_n <= max_n, got "
                f"{lookup.min_n}..{lookup.max_n}"
            )
        return NgramLookup(lookup.min_n, lookup.max_n)

    def _check_token_ids(self, sid: int, token_ids: tuple[int, ...]) -> None:
        # max() first: a prompt's ids are checked in C, the list is built only to refuse.
        if token_ids and max(token_ids) >= self.vocab_size:
            bad = [t for t in token_ids if t >= self.vocab_size]
            raise PlanError(
                f"sequence {sid}: token ids {bad[:5]} are outside the vocabulary "
                f"({self.vocab_size})"
            )

    def _check_block_ids(self, sid: int, block_ids: tuple[int, ...]) -> None:
        bad = self.pool.out_of_range(block_ids) if block_ids else None
        if bad:
            raise PlanError(
                f"sequence {sid}: block ids {bad[:5]} out of range (pool has "
                f"{self.pool.num_blocks} blocks)"
            )

    def _check_extent(
        self,
        sid: int,
        computed: int,
        scheduled: int,
        total: int,
        num_blocks: int,
        lookahead: int = 0,
    ) -> None:
        end = computed + scheduled
        if end > total:
            raise PlanError(
                f"sequence {sid}: {scheduled} tokens scheduled after {computed} computed, "
                f"but it has only {total} tokens"
            )
        # The KV the plan writes ends past the tokens the sequence has by now.
        end += lookahead
        if end > self.max_model_len:
            raise PlanError(
                f"sequence {sid}: {end} tokens exceed the model length {self.max_model_len}"
            )
        needed = self.pool.spec.blocks_for_tokens(end)
        if num_blocks < needed:
            raise PlanError(
                f"sequence {sid}: {num_blocks} blocks cannot hold {end} tokens "
                f"(block size {self.pool.block_size}, {needed} needed)"
            )

    @staticmethod
    def _deferred(
        plan: wpb.StepPlan, num_steps: int, planned: Collection[int], allowed: Mapping
    ) -> frozenset[int]:
        """The rows whose masks follow: planned, one step, not masked in the plan too."""
        if not plan.deferred_mask_seq_ids:
            return frozenset()
        if num_steps > 1:
            raise PlanError(f"a plan of {num_steps} steps has deferred masks: one step only")
        deferred = frozenset(plan.deferred_mask_seq_ids)
        if len(deferred) != len(plan.deferred_mask_seq_ids) or not deferred <= set(planned):
            raise PlanError("deferred_mask_seq_ids: a sequence not in the plan, or twice")
        if deferred & allowed.keys():
            raise PlanError("a sequence both in allowed_tokens and deferred_mask_seq_ids")
        return deferred

    @staticmethod
    def _masks(
        mask: wpb.TokenBitmask, num_steps: int, planned: Collection[int]
    ) -> tuple[Mapping[int, np.ndarray], Mapping[int, DraftRows]]:
        """seq_id -> its (first) mask row, and the rows of sequences that verify drafts.
        Plain decodes and the others count as planned alike."""
        if num_steps > 1 and mask.seq_ids:
            raise PlanError(f"a plan of {num_steps} steps has allowed_tokens: one step only")
        allowed, draft_rows = read_mask(mask)
        if len(allowed) != len(mask.seq_ids) or not allowed.keys() <= planned:
            raise PlanError("allowed_tokens: a sequence not in the plan, or twice")
        return allowed, draft_rows
