"""The fake worker's speculative decoding (fake_worker.py): a decode given
num_draft_tokens verifies the drafts of `drafter` (seq_id, output index, room) ->
draft ids, writing their KV first, so that a rejected draft leaves a stale slot which
any later read of that position catches. A constrained decode samples each position
with its row (worker.proto's row_counts) and emits only positions whose row followed
its own drafts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from cbserve.worker.v1 import worker_pb2 as wpb
from common.ngram import NgramIndex

from .fake_kv import SlotKV, contexts_of

# (seq_id, index of the next output token, room) -> the drafts to verify
Drafter = Callable[[int, int, int], list[int]]


class FakeDrafting:
    """Mixed into FakeWorker: needs its sequences, kv, block_size, drafter, draft_masks,
    draft_log, _sample and _check."""

    def _draft_room(self, plan: wpb.StepPlan, sampling: list[int]) -> dict[int, int]:
        room = {s.seq_id: s.num_draft_tokens for s in plan.continuing_sequences}
        room = {seq_id: k for seq_id, k in room.items() if k}
        if room:
            self._check(max(plan.num_steps, 1) == 1, "drafts in a multi-step plan")
            self._check(plan.ngram_lookup.min_n >= 1, "drafts without ngram_lookup")
            self._check(room.keys() <= set(sampling), "drafts for a sequence that does not sample")
        for seq_id in self.draft_masks:
            self._check(seq_id in room, f"draft rows for {seq_id}, which verifies no drafts")
        return room

    def _position_masks(self, seq_id: int, allowed: dict) -> tuple[list, list[int]] | None:
        """A drafting sequence's masks, (allowed ids per position, drafts they follow);
        None when it is free."""
        if seq_id in self.draft_masks:
            return self.draft_masks[seq_id]
        if seq_id in allowed:
            return [allowed[seq_id]], []
        return None

    def _verify(
        self,
        seq_id: int,
        room: int,
        result: wpb.StepResult,
        holders: Counter[int],
        masks: tuple[list, list[int]] | None = None,
    ) -> tuple[int, int]:
        """A decode's drafts written and verified; (tokens emitted, drafts verified).
        A constrained one emits only positions whose row followed its own drafts (as
        the real worker does after a deferred mask: the forward has run them all)."""
        seq = self.sequences[seq_id]
        drafts = self.drafter(seq_id, len(seq.sampled), room)[:room] if self.drafter else []
        positions = 1 + len(drafts)
        if masks is not None:
            rows, followed = masks
            agreed = 0
            while agreed < min(len(drafts), len(followed)) and drafts[agreed] == followed[agreed]:
                agreed += 1
            positions = min(1 + agreed, len(rows))
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
        for i in range(positions):
            token_id = self._sample(seq_id, result, masks[0][i] if masks is not None else None)
            emitted += 1
            if i == len(drafts) or token_id != drafts[i]:
                break
        self.draft_log.append((seq_id, drafts, emitted, masks[0][:positions] if masks else None))
        # Its token and the accepted drafts have KV now (equal to the emitted tokens').
        seq.num_computed_tokens = start + emitted - 1
        return emitted, len(drafts)


def ngram_drafter(worker, min_n: int, max_n: int) -> Drafter:
    """Drafts as the real worker proposes them (common/ngram.py), from the fake's tokens."""
    indexes: dict[int, NgramIndex] = {}

    def drafter(seq_id: int, index: int, room: int) -> list[int]:
        lookup = indexes.setdefault(seq_id, NgramIndex(min_n, max_n))
        return lookup.propose(worker.sequences[seq_id].token_ids, room)

    return drafter
