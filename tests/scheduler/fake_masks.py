"""The fake worker's structured outputs (fake_worker.py): the allowed-token rows a plan
carries, or sends after it (deferred masks), checked as the worker protocol says.

A mask is for sampling rows of a one-step plan only. A row with drafts to verify
carries one row per position (row_counts) and the drafts its rows follow; those land
in draft_masks for fake_drafting.py, and in draft_mask_log for tests. A deferred row
that never came samples unconstrained and is reported missing, as a real worker's
that waited in vain.
"""

from __future__ import annotations

import numpy as np

from cbserve.worker.v1 import worker_pb2 as wpb
from scheduler_svc.structured.bitmask import allowed_ids


class FakeMasking:
    """Mixed into FakeWorker: needs its sequences, draft_masks, draft_mask_log and
    _check."""

    def _masks_of_step(
        self,
        plan: wpb.StepPlan,
        deferred: wpb.StepPlan | None,
        sampling: list[int],
        result: wpb.StepResult,
    ) -> dict[int, np.ndarray]:
        """The allowed ids of each masked row of this step, from the plan and from the
        message with its deferred masks; deferred rows that did not come are reported
        in result.mask_missing_seq_ids."""
        allowed = self._allowed_tokens(plan.allowed_tokens, plan, sampling)
        if plan.deferred_mask_seq_ids:
            self._check(not allowed.keys() & set(plan.deferred_mask_seq_ids), "masked twice")
            came = (
                self._allowed_tokens(deferred.deferred_allowed_tokens, plan, sampling)
                if deferred is not None
                else {}
            )
            for seq_id in plan.deferred_mask_seq_ids:
                if seq_id in came:
                    allowed[seq_id] = came[seq_id]
                else:
                    result.mask_missing_seq_ids.append(seq_id)
        return allowed

    def _allowed_tokens(
        self, mask: wpb.TokenBitmask, plan: wpb.StepPlan, sampling: list[int]
    ) -> dict[int, np.ndarray]:
        """The allowed ids of each masked row; a mask must be for sampling rows of a
        one-step plan, as the worker protocol says."""
        if not mask.seq_ids:
            return {}
        self._check(
            max(plan.num_steps, 1) == 1, f"step {plan.step_id}: a mask in a multi-step plan"
        )
        counts = list(mask.row_counts) or [1] * len(mask.seq_ids)
        self._check(len(counts) == len(mask.seq_ids), "row_counts not parallel to seq_ids")
        self._check(
            len(mask.draft_token_ids) == sum(counts) - len(counts), "draft_token_ids miscounted"
        )
        rows = np.frombuffer(mask.words, dtype="<i4").reshape(sum(counts), -1)
        allowed = {}
        at = drafts_at = 0
        for seq_id, count in zip(mask.seq_ids, counts, strict=True):
            self._check(
                seq_id in sampling,
                f"step {plan.step_id}: a mask for {seq_id}, which does not sample",
            )
            allowed[seq_id] = allowed_ids(rows[at])
            if count > 1:
                drafts = list(mask.draft_token_ids[drafts_at : drafts_at + count - 1])
                self.draft_masks[seq_id] = ([allowed_ids(r) for r in rows[at : at + count]], drafts)
                # What the rows followed: the output so far, then the drafts.
                self.draft_mask_log.append(
                    (seq_id, list(self.sequences[seq_id].sampled), rows[at : at + count], drafts)
                )
                drafts_at += count - 1
            at += count
        return allowed
