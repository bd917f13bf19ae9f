"""A step's flat batch: every scheduled token of every sequence in one `[T]` row list,
with the attention layout, the rows the sampler reads and the prompt rows scored.

Row groups are ordered as the attention backends want them: decodes first, longest
context first (the CPU backend then sees them as one adjacent slice, which the native
decode step needs), then prefill chunks in plan order. A speculating sequence's
token and drafts are decodes of their own (one query each, context p + 1 + i, one
block table: speculation/verify.py), so they sort among the other decodes; which
sampler row belongs to which sequence and draft is kept in `sample_row`.

With `prefill_rows` (a model whose native step runs only decodes: models/qblock/
native.py), a prefill chunk is laid out the same way: each of its tokens a decode of
its own over the sequence's block table, so that a step with prompts in it runs in the
one native call too. A row attends up to its own position, which is the chunk's causal
mask; the native step writes every row's K/V before any row attends (`chained`). A
chunk whose prompt positions are scored (prompt logprobs) keeps its prefill layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from worker_svc.attention import BatchLayout
from worker_svc.prompt_logprobs import PromptRows, prompt_rows
from worker_svc.sequence import SequenceState
from worker_svc.speculation.verify import verification_rows

# A sampling sequence that verifies nothing this step (compared by identity).
NO_DRAFT: list[int] = []


class _Group(NamedTuple):
    seq: SequenceState
    token_ids: Sequence[int]
    start: int  # position of its first token
    # What the sampler reads for its last token's row, or None when it does not sample.
    sampler_row: object | None
    # (index into FlatBatch.sampling, draft position) of that row.
    owner: tuple[int, int]

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start + len(self.token_ids)


class FlatBatch:
    """Built from the step's (sequence, tokens to compute) pairs and drafts."""

    def __init__(
        self,
        work: Sequence[tuple[SequenceState, int]],
        drafts: Mapping[int, list[int]],
        block_size: int,
        prefill_rows: bool = False,
    ):
        # Each sampling sequence in plan order, with its drafts (NO_DRAFT: none).
        self.sampling: list[tuple[SequenceState, list[int]]] = []
        groups: list[_Group] = []
        for seq, n in work:
            start = seq.num_computed_tokens
            draft = drafts.get(seq.seq_id)
            if draft is not None:
                owner = len(self.sampling)
                self.sampling.append((seq, draft))
                tokens = (seq.token_ids[start], *draft)
                rows = verification_rows(seq, draft)
                for i, (token, row) in enumerate(zip(tokens, rows, strict=True)):
                    groups.append(_Group(seq, (token,), start + i, row, (owner, i)))
                continue
            end = start + n
            samples = end == seq.num_tokens
            owner = (len(self.sampling), 0) if samples else (-1, 0)
            if samples:
                self.sampling.append((seq, NO_DRAFT))
            if prefill_rows and n > 1 and prompt_rows(seq, start, end) is None:
                # Only the chunk's last row samples (when the chunk ends the prompt).
                for position in range(start, end - 1):
                    groups.append(_Group(seq, (seq.token_ids[position],), position, None, (-1, 0)))
                start = end - 1
            groups.append(
                _Group(seq, seq.token_ids[start:end], start, seq if samples else None, owner)
            )
        groups.sort(key=lambda g: (g.query_len != 1, -g.context_len if g.query_len == 1 else 0))

        self.input_ids: list[int] = []
        self.positions: list[int] = []
        self.keep: list[int] = []  # flat index of each sampler row
        self.sampler_rows: list = []
        self.sample_row: dict[tuple[int, int], int] = {}  # owner -> index into keep
        self.scoring: list[PromptRows] = []
        self.scoring_rows: list[int] = []  # flat index of each prompt position scored
        for group in groups:
            at = len(self.input_ids)
            if (rows := prompt_rows(group.seq, group.start, group.context_len)) is not None:
                self.scoring.append(rows)
                self.scoring_rows.extend(range(at, at + rows.num_rows))
            self.input_ids.extend(group.token_ids)
            self.positions.extend(range(group.start, group.context_len))
            if group.sampler_row is not None:
                self.sample_row[group.owner] = len(self.keep)
                self.keep.append(len(self.input_ids) - 1)
                self.sampler_rows.append(group.sampler_row)
        # (LoRA slot, rows) of each row group in row order: the step's LoraBatch.
        self.adapter_rows = [(g.seq.adapter_slot, g.query_len) for g in groups]
        self.layout = BatchLayout(
            query_lens=tuple(g.query_len for g in groups),
            context_lens=tuple(g.context_len for g in groups),
            block_tables=tuple(tuple(g.seq.block_ids) for g in groups),
            block_size=block_size,
        )

    def rows_of(self, owner: int, count: int) -> list[int]:
        """Sampler row indices of sampling sequence `owner`'s `count` tokens in order."""
        return [self.sample_row[(owner, i)] for i in range(count)]
