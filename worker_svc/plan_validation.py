"""Checks a StepPlan against the worker's state before anything changes.

A plan that contradicts what the worker holds (an unknown or twice-listed sequence,
a token outside the vocabulary, a block outside the pool, more tokens scheduled than
a sequence has or its blocks can hold, a multi-step plan with anything but decodes)
is rejected whole with a PlanError, which the server answers with INVALID_ARGUMENT:
the worker is left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cbserve.worker.v1 import worker_pb2
from common.plan_sequences import continuing_sequences
from common.sampling_codec import sampling_from_worker
from common.sampling_params import MAX_LOGPROBS, SamplingParams
from worker_svc.errors import PlanError
from worker_svc.kv_pool import KVPool
from worker_svc.sequence import SequenceState


@dataclass(frozen=True)
class PlanValidator:
    """What every plan is checked against: the model's vocabulary and length, the pool."""

    vocab_size: int
    max_model_len: int
    pool: KVPool

    def validate(
        self, plan: worker_pb2.StepPlan, sequences: Mapping[int, SequenceState]
    ) -> dict[int, SamplingParams]:
        """The sampling parameters of the plan's new sequences; raises PlanError."""
        num_steps = max(plan.num_steps, 1)
        if num_steps > 1 and plan.new_sequences:
            raise PlanError(f"a plan of {num_steps} steps has new sequences: decodes only")
        live = set(sequences) - set(plan.finished_seq_ids)
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
            if new.HasField("prompt_logprobs") and new.prompt_logprobs > MAX_LOGPROBS:
                raise PlanError(
                    f"sequence {sid}: prompt_logprobs {new.prompt_logprobs} is over {MAX_LOGPROBS}"
                )
            try:
                sampling[sid] = sampling_from_worker(new.sampling)
            except ValueError as exc:
                raise PlanError(f"sequence {sid}: {exc}") from None
        for sid, num_scheduled, new_block_ids in continuing_sequences(plan):
            if sid in listed:
                raise PlanError(f"sequence {sid} is listed twice")
            listed.add(sid)
            if sid not in live:
                raise PlanError(f"unknown sequence {sid}: not held by this worker on this stream")
            seq = sequences[sid]
            self._check_block_ids(sid, new_block_ids)
            is_decode = num_scheduled == 1
            if num_steps > 1 and not (is_decode and seq.num_computed_tokens + 1 == seq.num_tokens):
                raise PlanError(
                    f"sequence {sid}: a plan of {num_steps} steps must only hold decodes"
                )
            self._check_extent(
                sid,
                seq.num_computed_tokens,
                num_scheduled,
                seq.num_tokens,
                len(seq.block_ids) + len(new_block_ids),
                # Each step after the first computes the token the one before sampled.
                lookahead=num_steps - 1,
            )
        return sampling

    def _check_token_ids(self, sid: int, token_ids: Iterable[int]) -> None:
        bad = [t for t in token_ids if t >= self.vocab_size]
        if bad:
            raise PlanError(
                f"sequence {sid}: token ids {bad[:5]} are outside the vocabulary "
                f"({self.vocab_size})"
            )

    def _check_block_ids(self, sid: int, block_ids: Iterable[int]) -> None:
        bad = self.pool.out_of_range(block_ids)
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
