"""A worker plan's continuing sequences, whichever of its two forms carries them.

A continuing sequence comes either as a ContinuingSequence message or, for a plain
decode (one token, no new block), as an id in the packed `decode_seq_ids` list, which
the scheduler builds a hundred times cheaper (worker.proto). The test workers read
them here, in the plan's order: the messages first, then the packed decodes. The
worker reads a plan once, in its own reader (worker_svc/step/reader.py), which keeps
the packed decodes packed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cbserve.worker.v1 import worker_pb2 as wpb

NO_BLOCKS: tuple[int, ...] = ()


def continuing_sequences(plan: wpb.StepPlan) -> Iterator[tuple[int, int, Sequence[int]]]:
    """(seq_id, num_scheduled_tokens, new_block_ids) of each continuing sequence."""
    for sequence in plan.continuing_sequences:
        yield sequence.seq_id, sequence.num_scheduled_tokens, sequence.new_block_ids
    for seq_id in plan.decode_seq_ids:
        yield seq_id, 1, NO_BLOCKS
