"""The fake worker's speculative decoding (fake_worker.py): a decode given
num_draft_tokens verifies the drafts of `drafter` (seq_id, output index, room) ->
draft ids, writing their KV first, so that a rejected draft leaves a stale slot which
any later read of that position catches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from cbserve.worker.v1 import worker_pb2 as wpb

from .fake_kv import SlotKV, contexts_of

# (seq_id, index of the next output token, room) -> the drafts to verify
Drafter = Callable[[int, int, int], list[int]]


class FakeDrafting:
    """Mixed into FakeWorker: needs its sequences, kv, block_size, drafter, _sample and
    _check."""

    def _draft_room(self, plan: wpb.StepPlan, sampling: list[int]) -> dict[int, int]:
        room = {s.seq_id: s.num_draft_tokens for s in plan.continuing_sequences}
        room = {seq_id: k for seq_id, k in room.items() if k}
        if room:
            self._check(max(plan.num_steps, 1) == 1, "drafts in a multi-step plan")
            self._check(plan.ngram_lookup.min_n >= 1, "drafts without ngram_lookup")
            self._check(room.keys() <= set(sampling), "drafts for a sequence that does not sample")
            masked = set(plan.allowed_tokens.seq_ids) | set(plan.deferred_mask_seq_ids)
            self._check(not room.keys() & masked, "drafts for a constrained sequence")
        return room

    def _verify(
        self, seq_id: int, room: int, result: wpb.StepResult, holders: Counter[int]
    ) -> tuple[int, int]:
        """A decode's drafts written and verified; (tokens emitted, drafts verified)."""
        seq = self.sequences[seq_id]
        drafts = self.drafter(seq_id, len(seq.sampled), room)[:room] if self.drafter else []
        start = seq.num_computed_tokens  # the decode's own token is computed already
        self._check(
            start + len(drafts) <= len(seq.block_ids) * self.block_size,
            f"sequence {seq_id}: {len(seq.block_ids)} blocks cannot hold its drafts",
        )
        contexts = contexts_of([*seq.token_ids, *drafts])
        for i, draft in enumerate(drafts):
            position = start + i
            block_id = seq.block_ids[position // self.block_size]
            self._check(holders[block_id] == 1, f"a draft written into shared block {block_id}")
            self.kv[block_id][position % self.block_size] = SlotKV(
                draft, position, contexts[position]
            )
        emitted = 0
        for i in range(len(drafts) + 1):
            token_id = self._sample(seq_id, result, None)
            emitted += 1
            if i == len(drafts) or token_id != drafts[i]:
                break
        # Its token and the accepted drafts have KV now (equal to the emitted tokens').
        seq.num_computed_tokens = start + emitted - 1
        return emitted, len(drafts)
