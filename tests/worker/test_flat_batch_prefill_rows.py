"""FlatBatch with prefill_rows: a prompt chunk's tokens laid out as decode rows of their
own (one query each, context position + 1, the sequence's block table), for a native
step that runs only decodes; only a chunk that ends the prompt samples, from its last
row; a chunk whose prompt positions are scored keeps its prefill layout."""

from __future__ import annotations

from common.sampling_params import SamplingParams
from worker_svc.sequence import SequenceState
from worker_svc.step.flat_batch import FlatBatch

BLOCK_SIZE = 4


def _sequence(seq_id: int, tokens: list[int], computed: int, prompt_logprobs=None):
    blocks = list(range(seq_id * 8, seq_id * 8 + 8))
    return SequenceState(
        seq_id=seq_id,
        token_ids=tokens,
        num_prompt_tokens=len(tokens),
        num_computed_tokens=computed,
        block_ids=blocks,
        sampling=SamplingParams(),
        prompt_logprobs=prompt_logprobs,
    )


def _work():
    decoding = _sequence(0, list(range(100, 121)), computed=20)  # 21 tokens, 1 to compute
    whole = _sequence(1, list(range(200, 206)), computed=0)  # a 6-token prompt at once
    middle = _sequence(2, list(range(300, 310)), computed=2)  # tokens 2..5 of 10
    return [(decoding, 1), (whole, 6), (middle, 4)]


def test_prompt_chunks_become_one_row_per_token():
    work = _work()
    batch = FlatBatch(work, {}, BLOCK_SIZE, prefill_rows=True)
    layout = batch.layout
    assert layout.query_lens == (1,) * 11
    # Decodes sort by context, longest first: the decode (21), then each chunk's rows.
    assert layout.context_lens == (21, 6, 6, 5, 5, 4, 4, 3, 3, 2, 1)
    assert batch.positions == [c - 1 for c in layout.context_lens]
    # Each row: its sequence's block table, and that sequence's token at its position.
    by_table = {tuple(seq.block_ids): seq for seq, _ in work}
    for token, position, table in zip(
        batch.input_ids, batch.positions, layout.block_tables, strict=True
    ):
        assert by_table[table].token_ids[position] == token
    rows_per_sequence = [by_table[table].seq_id for table in layout.block_tables]
    assert sorted(rows_per_sequence) == [0] + [1] * 6 + [2] * 4
    # The decode and the whole prompt's last row sample; the middle chunk does not.
    assert [batch.positions[row] for row in batch.keep] == [20, 5]
    assert [seq.seq_id for seq, _ in batch.sampling] == [0, 1]
    assert [seq.seq_id for seq in batch.sampler_rows] == [0, 1]
    assert batch.rows_of(1, 1) == [1]


def test_without_prefill_rows_a_chunk_stays_one_prefill():
    batch = FlatBatch(_work(), {}, BLOCK_SIZE)
    assert batch.layout.query_lens == (1, 6, 4)
    assert batch.layout.context_lens == (21, 6, 6)
    assert [batch.positions[row] for row in batch.keep] == [20, 5]
    assert batch.input_ids == [120, *range(200, 206), *range(302, 306)]


def test_a_scored_chunk_keeps_its_prefill_layout():
    scored = _sequence(3, list(range(400, 405)), computed=0, prompt_logprobs=1)
    plain = _sequence(4, list(range(500, 503)), computed=0)
    batch = FlatBatch([(scored, 5), (plain, 3)], {}, BLOCK_SIZE, prefill_rows=True)
    assert batch.layout.query_lens == (1, 1, 1, 5)
    assert batch.layout.context_lens == (3, 2, 1, 5)
    assert batch.scoring_rows == [3, 4, 5, 6]  # the scored chunk's first four positions
    assert [batch.positions[row] for row in batch.keep] == [2, 4]
