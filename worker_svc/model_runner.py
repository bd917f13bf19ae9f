"""Runs one step: update sequence state, one forward over a flat batch, sample.

The wire's StepPlan is read once at the door (execute), into a Step of plain values
(step/description.py) that everything after it reads. A step is a diff (vLLM's
SchedulerOutput style): finished ids are dropped, new sequences registered with all
their tokens, continuing ones get new blocks and a count of tokens to compute. All
scheduled tokens of all
sequences become one flat `[T]` batch with no padding; logits are computed only
at the last scheduled position of each sequence that samples, which is every
sequence whose scheduled tokens reach the end of the tokens it has.

Constrained rows planned ahead of their pending sample (async scheduling) get their
masks in a later message (step/deferred_masks.py): the forward runs at once and
only the sampler waits for them. A constrained row that verifies drafts gets a row
per position, each after the drafts before it; it emits only positions whose row
followed its own drafts (drafts past them are dropped before the forward where the
masks came in the plan, their tokens after it where they came later).

A plan of num_steps > 1 (multi-step decoding; decodes only) runs that many
forwards back to back: each samples one token per sequence, which the next
computes, into the blocks the plan gave.

The reader (step/reader.py) checks the whole plan before anything changes, so a
rejected plan leaves the worker as it was.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.attention import AttentionBackend, PagedAttentionContext
from worker_svc.kv_pool import KVPool
from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.slots import LoraSlots
from worker_svc.model_loader import LoadedModel
from worker_svc.models.qblock.native import attends_with
from worker_svc.prompt_logprobs import score
from worker_svc.sampler import Sampler
from worker_svc.sequence import SequenceState
from worker_svc.speculation.rows import (
    NO_DRAFTS,
    cap_masked_drafts,
    propose_drafts,
    record_counts,
)
from worker_svc.speculation.verify import emitted_tokens
from worker_svc.step.deferred_masks import UNMASKED, MaskMailbox, StepMasks
from worker_svc.step.description import Step
from worker_svc.step.flat_batch import NO_DRAFT, FlatBatch
from worker_svc.step.reader import PlanReader


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        pool: KVPool,
        backend: AttentionBackend,
        sampler: Sampler | None = None,
        lora_slots: LoraSlots | None = None,
    ):
        self.loaded = loaded
        self.pool = pool
        self.backend = backend
        self.sampler = sampler or Sampler(loaded.device)
        self.sequences: dict[int, SequenceState] = {}
        # LoRA adapters' slots (--enable-lora), written between steps (lora/loading.py).
        self.lora_slots = lora_slots
        self.reader = PlanReader(loaded.vocab_size, loaded.max_model_len, pool, lora_slots)
        # Called with each step before it runs: the KV receiver takes the blocks it
        # assigns from transfers still landing (kv_transfer/landing.py).
        self.before_step = None
        # Deferred masks as the Step stream reads them (the servicer posts them).
        self.mailbox = MaskMailbox()
        # Prompt chunks as decode rows (step/flat_batch.py), where a native step runs
        # the decodes: then a step with prompts in it is one native call too.
        # (The null worker's model has no forward: worker_svc/null.)
        native = getattr(getattr(loaded, "model", None), "native_decode", None)
        self.prefill_rows = native is not None and attends_with(backend, pool)

    def reset(self) -> None:
        """Forget every sequence (a new Step stream starts empty)."""
        self.sequences.clear()

    def execute(self, plan: worker_pb2.StepPlan) -> worker_pb2.StepResult:
        """Reads the plan (PlanError, and nothing changed, if it is refused) and runs it."""
        started = time.perf_counter()
        step = self.reader.read(plan, self.sequences)
        if self.before_step is not None:
            self.before_step(step)
        result = self.run(step)
        result.forward_seconds = time.perf_counter() - started
        return result

    def run(self, step: Step) -> worker_pb2.StepResult:
        """Runs a step the reader let through: nothing here checks it again."""
        scheduled, draft_room = self._apply(step)
        drafts = propose_drafts(self.sequences, draft_room, step.ngram_lookup)
        if drafts and step.allowed_tokens:
            drafts = cap_masked_drafts(drafts, step.allowed_tokens, step.allowed_draft_rows)
        result = worker_pb2.StepResult(step_id=step.step_id)
        # In plan order: FlatBatch orders the rows as the attention backends want them.
        work = [(seq, n) for seq, n in scheduled if n > 0]
        num_tokens = sum(n for _, n in work) + sum(len(d) for d in drafts.values())
        masks = StepMasks(
            step.step_id,
            step.allowed_tokens,
            step.deferred_mask_seq_ids,
            self.mailbox,
            step.deferred_mask_timeout_s,
            step.allowed_draft_rows,
        )
        decoding = self._run(work, masks, result, drafts) if work else []
        result.mask_missing_seq_ids.extend(masks.missing)
        # Multi-step (the reader allowed decodes only, and no masks): each further step
        # computes the token the step before sampled, back to back, with no round trip.
        for _ in range(1, step.num_steps if decoding else 1):
            self._run([(seq, 1) for seq in decoding], UNMASKED, result)
            num_tokens += len(decoding)
        result.num_tokens = num_tokens
        return result

    # -- state changes and the forward ------------------------------------------------------

    def _apply(self, step: Step) -> tuple[list[tuple[SequenceState, int]], dict[int, int]]:
        """The plan's state changes; returns what each sequence computes, and the most
        drafts each speculating one may verify."""
        sequences = self.sequences
        draft_room: dict[int, int] = {}
        for sid in step.finished_seq_ids:
            sequences.pop(sid, None)
        scheduled: list[tuple[SequenceState, int]] = []
        for new in step.new_sequences:
            seq = SequenceState.create(
                seq_id=new.seq_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                num_computed_tokens=new.num_computed_tokens,
                block_ids=list(new.block_ids),
                sampling=new.sampling,
                vocab_size=self.loaded.vocab_size,
                prompt_logprobs=new.prompt_logprobs,
                adapter_slot=new.adapter_slot,
            )
            sequences[seq.seq_id] = seq
            scheduled.append((seq, new.num_scheduled_tokens))
        for continuing in step.continuing_sequences:
            seq = sequences[continuing.seq_id]
            seq.block_ids.extend(continuing.new_block_ids)
            scheduled.append((seq, continuing.num_scheduled_tokens))
            if continuing.num_draft_tokens:
                draft_room[seq.seq_id] = continuing.num_draft_tokens
        scheduled.extend((sequences[sid], 1) for sid in step.decode_seq_ids)
        return scheduled, draft_room

    def _run(
        self,
        work: list[tuple[SequenceState, int]],
        masks: StepMasks,
        result: worker_pb2.StepResult,
        drafts: Mapping[int, list[int]] = NO_DRAFTS,
    ) -> list[SequenceState]:
        """One forward; appends each sampled token to its sequence and to the result.

        Returns the sequences that sampled. The result lists them in seq_ids on its
        first step only: a later step of a multi-step plan samples the same ones, in
        the same order, so its tokens follow step-major in token_ids. A sequence with
        drafts computes them too, each a decode row of its own (speculation/verify.py),
        and emits its accepted drafts and the token after them.
        """
        batch = FlatBatch(work, drafts, self.pool.block_size, self.prefill_rows)
        keep, samplers, scoring = batch.keep, batch.sampler_rows, batch.scoring
        layout = batch.layout
        device = self.loaded.device
        lora = None
        if self.lora_slots is not None:
            lora = LoraBatch.from_sequences(batch.adapter_rows).to(device)
        context = PagedAttentionContext(
            self.backend, self.pool, self.backend.build_metadata(layout, device), lora
        )
        with torch.inference_mode():
            logits = self.loaded.model(
                torch.tensor(batch.input_ids, device=device),
                torch.tensor(batch.positions, device=device),
                context,
                # With nothing to sample or score (only middle prefill chunks), one row
                # is still asked for: the model needs some index, the row is ignored.
                torch.tensor(
                    keep + batch.scoring_rows or [len(batch.input_ids) - 1], device=device
                ),
            )
            # Where rows are deferred, this waits for them: after the forward.
            masked = masks.rows() if masks else None
            caps: dict[int, int] = {}
            if masked and drafts:
                allowed = position_rows(batch, masks, caps)
            elif masked:
                allowed = [masked.get(row.seq_id) for row in samplers]
            else:
                allowed = None
            sampled = (
                self.sampler.sample(logits[: len(keep)], samplers, allowed) if samplers else None
            )
            if scoring:
                result.prompt_logprobs.extend(score(logits[len(keep) :], scoring))

        for seq, n in work:
            if seq.seq_id not in drafts:
                seq.num_computed_tokens += n
        if sampled is None:
            return []
        first_step = not result.token_ids
        verified: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens emitted, drafts)
        for owner, (seq, draft) in enumerate(batch.sampling):
            rows = batch.rows_of(owner, len(draft) + 1)
            tokens = [sampled.token_ids[row] for row in rows]
            emitted = emitted_tokens(tokens, draft) if draft is not NO_DRAFT else 1
            if draft is not NO_DRAFT:
                num_drafts = len(draft)
                if owner in caps:  # a constrained row emits only where it had a mask
                    emitted = min(emitted, caps[owner])
                    num_drafts = min(num_drafts, caps[owner])
                # Its token and the accepted drafts now have KV; the slots after are stale.
                seq.num_computed_tokens += emitted
                verified[seq.seq_id] = (emitted, num_drafts)
            for i in range(emitted):
                seq.append_token(tokens[i])
                logprobs = sampled.logprobs[rows[i]]
                record_sample(result, seq.seq_id, tokens[i], logprobs, first_step and i == 0)
        if verified:
            record_counts(result, verified)
        return [seq for seq, _ in batch.sampling]


def position_rows(batch: FlatBatch, masks: StepMasks, caps: dict[int, int]) -> list:
    """Each sampler row's mask (None: free) where sequences verify drafts: a constrained
    one's positions get the rows that followed its drafts (StepMasks.position_rows),
    and caps[owner] says how many positions it may emit; its positions past those
    sample unmasked and are never emitted."""
    allowed: list = [None] * len(batch.keep)
    for owner, (seq, draft) in enumerate(batch.sampling):
        rows = masks.position_rows(seq.seq_id, draft)
        if rows is None:
            continue
        for index, row in zip(batch.rows_of(owner, len(rows)), rows, strict=True):
            allowed[index] = row
        if draft is not NO_DRAFT:
            caps[owner] = len(rows)
    return allowed


def record_sample(result, seq_id: int, token: int, logprobs, first_step: bool) -> None:
    """Appends one sampled token (and its logprobs, if asked) to a step's result; the
    sequence ids are listed once, by the first step of a multi-step plan."""
    if first_step:
        result.seq_ids.append(seq_id)
    index = len(result.token_ids)
    result.token_ids.append(token)
    if logprobs is not None:
        result.logprobs.append(
            worker_pb2.SampledLogprobs(
                index=index,
                logprob=logprobs.logprob,
                top_token_ids=logprobs.top_token_ids,
                top_logprobs=logprobs.top_logprobs,
            )
        )
