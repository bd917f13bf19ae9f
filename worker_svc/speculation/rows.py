"""A step's drafts and what its result says of them: proposing the drafts of the
sequences a plan lets speculate (capped, for a constrained one, to the positions its
masks cover), and the result's per-sequence counts.

How the drafts are computed (each a decode row of its own) is step/flat_batch.py's;
how they are accepted, verify.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cbserve.worker.v1 import worker_pb2
from worker_svc.sequence import SequenceState
from worker_svc.step.description import NgramLookup
from worker_svc.token_bitmask import DraftRows

NO_DRAFTS: Mapping[int, list[int]] = MappingProxyType({})


def propose_drafts(
    sequences: Mapping[int, SequenceState],
    draft_room: Mapping[int, int],
    lookup: NgramLookup | None,
) -> Mapping[int, list[int]]:
    """seq_id -> its drafts, for the sequences the plan lets draft that found some."""
    if not draft_room or lookup is None:
        return NO_DRAFTS
    drafts = {}
    for seq_id, room in draft_room.items():
        proposed = sequences[seq_id].propose_drafts(room, lookup.min_n, lookup.max_n)
        if proposed:
            drafts[seq_id] = proposed
    return drafts


def cap_masked_drafts(
    drafts: Mapping[int, list[int]],
    allowed: Mapping[int, object],
    draft_rows: Mapping[int, DraftRows],
) -> Mapping[int, list[int]]:
    """The drafts a step verifies where masks came in its plan: a constrained sequence
    keeps only the drafts whose next position has a row that followed them (the
    scheduler's rows stop at a draft the grammar forbids, whose row forbids it, so
    that draft could never be accepted: dropping it before the forward changes no
    token)."""
    capped = dict(drafts)
    for seq_id, proposed in drafts.items():
        if seq_id not in allowed:
            continue
        rows = draft_rows.get(seq_id)
        keep = rows.usable_positions(proposed) - 1 if rows is not None else 0
        if keep:
            capped[seq_id] = proposed[:keep]
        else:
            del capped[seq_id]
    return capped


def record_counts(result: worker_pb2.StepResult, verified: Mapping[int, tuple[int, int]]) -> None:
    """The result's token_counts and draft_counts, parallel to its seq_ids: (tokens
    emitted, drafts verified) of each sequence that verified drafts, (1, 0) elsewhere."""
    for seq_id in result.seq_ids:
        emitted, num_drafts = verified.get(seq_id, (1, 0))
        result.token_counts.append(emitted)
        result.draft_counts.append(num_drafts)
