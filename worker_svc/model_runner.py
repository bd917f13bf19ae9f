"""Runs one StepPlan: update sequence state, one forward over a flat batch, sample.

A plan is a diff (vLLM's SchedulerOutput style): finished ids are dropped,
new sequences registered with all their tokens, continuing ones get new
blocks and a count of tokens to compute. All scheduled tokens of all
sequences become one flat `[T]` batch with no padding; logits are computed only
at the last scheduled position of each sequence that samples, which is every
sequence whose scheduled tokens reach the end of the tokens it has.

The whole plan is validated before any state changes, so a rejected plan
leaves the worker as it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.attention import AttentionBackend, BatchLayout, PagedAttentionContext
from worker_svc.errors import PlanError
from worker_svc.kv_pool import KVPool
from worker_svc.model_loader import LoadedModel
from worker_svc.sampler import Sampler
from worker_svc.sampling_params import SamplingParams
from worker_svc.sequence import SequenceState

__all__ = ["ModelRunner", "PlanError"]


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        pool: KVPool,
        backend: AttentionBackend,
        sampler: Sampler | None = None,
    ):
        self.loaded = loaded
        self.pool = pool
        self.backend = backend
        self.sampler = sampler or Sampler(loaded.device)
        self.sequences: dict[int, SequenceState] = {}

    def reset(self) -> None:
        """Forget every sequence (a new Step stream starts empty)."""
        self.sequences.clear()

    def execute(self, plan: worker_pb2.StepPlan) -> worker_pb2.StepResult:
        started = time.perf_counter()
        sampling = self._validate(plan)
        scheduled = self._apply(plan, sampling)
        result = worker_pb2.StepResult(step_id=plan.step_id)
        # Decodes first, longest context first: the attention backends then see
        # decodes, and decodes of similar length, as adjacent slices.
        work = sorted(
            ((seq, n) for seq, n in scheduled if n > 0),
            key=lambda w: (w[1] != 1, -w[0].num_computed_tokens if w[1] == 1 else 0),
        )
        if work:
            self._run(work, result)
        result.num_tokens = sum(n for _, n in work)
        result.forward_seconds = time.perf_counter() - started
        return result

    # -- validation: no state changes ------------------------------------------------------

    def _validate(self, plan: worker_pb2.StepPlan) -> dict[int, SamplingParams]:
        live = set(self.sequences) - set(plan.finished_seq_ids)
        listed: set[int] = set()
        sampling: dict[int, SamplingParams] = {}
        for new in plan.new_sequences:
            sid = new.seq_id
            if sid in listed or sid in live:
                raise PlanError(f"new sequence {sid} is already held or listed twice")
            listed.add(sid)
            if not new.prompt_token_ids:
                raise PlanError(f"new sequence {sid} has no prompt tokens")
            self._check_token_ids(sid, new.prompt_token_ids)
            self._check_token_ids(sid, new.output_token_ids)
            self._check_block_ids(sid, new.block_ids)
            total = len(new.prompt_token_ids) + len(new.output_token_ids)
            self._check_extent(
                sid, new.num_computed_tokens, new.num_scheduled_tokens, total, len(new.block_ids)
            )
            try:
                sampling[sid] = SamplingParams.from_proto(new.sampling)
            except ValueError as exc:
                raise PlanError(f"sequence {sid}: {exc}") from None
        for cont in plan.continuing_sequences:
            sid = cont.seq_id
            if sid in listed:
                raise PlanError(f"sequence {sid} is listed twice")
            listed.add(sid)
            if sid not in live:
                raise PlanError(f"unknown sequence {sid}: not held by this worker on this stream")
            seq = self.sequences[sid]
            self._check_block_ids(sid, cont.new_block_ids)
            self._check_extent(
                sid,
                seq.num_computed_tokens,
                cont.num_scheduled_tokens,
                seq.num_tokens,
                len(seq.block_ids) + len(cont.new_block_ids),
            )
        return sampling

    def _check_token_ids(self, sid: int, token_ids: Iterable[int]) -> None:
        vocab = self.loaded.vocab_size
        bad = [t for t in token_ids if t >= vocab]
        if bad:
            raise PlanError(
                f"sequence {sid}: token ids {bad[:5]} are outside the vocabulary ({vocab})"
            )

    def _check_block_ids(self, sid: int, block_ids: Iterable[int]) -> None:
        bad = self.pool.out_of_range(block_ids)
        if bad:
            raise PlanError(
                f"sequence {sid}: block ids {bad[:5]} out of range (pool has "
                f"{self.pool.num_blocks} blocks)"
            )

    def _check_extent(
        self, sid: int, computed: int, scheduled: int, total: int, num_blocks: int
    ) -> None:
        end = computed + scheduled
        if end > total:
            raise PlanError(
                f"sequence {sid}: {scheduled} tokens scheduled after {computed} computed, "
                f"but it has only {total} tokens"
            )
        if end > self.loaded.max_model_len:
            raise PlanError(
                f"sequence {sid}: {end} tokens exceed the model length {self.loaded.max_model_len}"
            )
        needed = self.pool.spec.blocks_for_tokens(end)
        if num_blocks < needed:
            raise PlanError(
                f"sequence {sid}: {num_blocks} blocks cannot hold {end} tokens "
                f"(block size {self.pool.block_size}, {needed} needed)"
            )

    # -- state changes and the forward ------------------------------------------------------

    def _apply(
        self, plan: worker_pb2.StepPlan, sampling: dict[int, SamplingParams]
    ) -> list[tuple[SequenceState, int]]:
        for sid in plan.finished_seq_ids:
            self.sequences.pop(sid, None)
        scheduled: list[tuple[SequenceState, int]] = []
        for new in plan.new_sequences:
            seq = SequenceState.create(
                seq_id=new.seq_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                num_computed_tokens=new.num_computed_tokens,
                block_ids=list(new.block_ids),
                sampling=sampling[new.seq_id],
                vocab_size=self.loaded.vocab_size,
            )
            self.sequences[seq.seq_id] = seq
            scheduled.append((seq, new.num_scheduled_tokens))
        for cont in plan.continuing_sequences:
            seq = self.sequences[cont.seq_id]
            seq.block_ids.extend(cont.new_block_ids)
            scheduled.append((seq, cont.num_scheduled_tokens))
        return scheduled

    def _run(self, work: list[tuple[SequenceState, int]], result: worker_pb2.StepResult) -> None:
        input_ids: list[int] = []
        positions: list[int] = []
        keep: list[int] = []  # flat-batch index of each sampling sequence's last token
        samplers: list[SequenceState] = []
        for seq, n in work:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            if end == seq.num_tokens:
                keep.append(len(input_ids) - 1)
                samplers.append(seq)
        layout = BatchLayout(
            query_lens=tuple(n for _, n in work),
            context_lens=tuple(seq.num_computed_tokens + n for seq, n in work),
            block_tables=tuple(tuple(seq.block_ids) for seq, _ in work),
            block_size=self.pool.block_size,
        )
        device = self.loaded.device
        context = PagedAttentionContext(
            self.backend, self.pool, self.backend.build_metadata(layout, device)
        )
        with torch.inference_mode():
            logits = self.loaded.model(
                torch.tensor(input_ids, device=device),
                torch.tensor(positions, device=device),
                context,
                # With nothing to sample (only middle prefill chunks), one row is
                # still asked for: the model needs some index, the row is ignored.
                torch.tensor(keep or [len(input_ids) - 1], device=device),
            )
            sampled = self.sampler.sample(logits, samplers) if samplers else None

        for seq, n in work:
            seq.num_computed_tokens += n
        if sampled is None:
            return
        for index, (seq, token) in enumerate(zip(samplers, sampled.token_ids, strict=True)):
            seq.append_token(token)
            result.seq_ids.append(seq.seq_id)
            result.token_ids.append(token)
            logprobs = sampled.logprobs[index]
            if logprobs is not None:
                result.logprobs.append(
                    worker_pb2.SampledLogprobs(
                        index=index,
                        logprob=logprobs.logprob,
                        top_token_ids=logprobs.top_token_ids,
                        top_logprobs=logprobs.top_logprobs,
                    )
                )
