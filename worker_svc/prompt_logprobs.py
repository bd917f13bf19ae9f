"""Prompt logprobs: how likely the model found each prompt token, from the same flat batch.

The logits of prompt position q score the token at q + 1, so a step that computes a
sequence's positions [start, end) scores prompt tokens start + 1 .. min(end, P - 1)
(P: prompt length; the logits of position P - 1 are the sampling row, and position 0
is scored by nothing). Those rows are added to the rows the model computes logits for
(ModelRunner._run), after the sampling rows; everything else in the batch stays as it
is. Over the chunks of a chunked prefill every prompt token but the first is scored
once. The values come from the raw logits, as the sampled tokens' logprobs do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.sequence import SequenceState

# Rows normalized at once: bounds the temporary of logsumexp on a long prefill chunk.
_ROWS_PER_PIECE = 256


@dataclass(frozen=True)
class PromptRows:
    """The rows of one sequence's chunk that score prompt tokens."""

    seq: SequenceState
    # The prompt position the first row scores (>= 1).
    first_position: int
    num_rows: int


def prompt_rows(seq: SequenceState, start: int, end: int) -> PromptRows | None:
    """The scoring rows of seq's chunk [start, end), or None (not asked, or none there)."""
    if seq.prompt_logprobs is None:
        return None
    scored_end = min(end, seq.num_prompt_tokens - 1)
    if scored_end <= start:
        return None
    return PromptRows(seq, start + 1, scored_end - start)


def score(logits: torch.Tensor, wanted: list[PromptRows]) -> list[worker_pb2.PromptLogprobs]:
    """logits `[sum of num_rows, vocab]`, the rows of `wanted` in order (normalized in
    place) -> one PromptLogprobs per entry."""
    for begin in range(0, logits.shape[0], _ROWS_PER_PIECE):
        piece = logits[begin : begin + _ROWS_PER_PIECE]
        piece -= piece.logsumexp(-1, keepdim=True)
    results = []
    offset = 0
    for rows in wanted:
        logprobs = logits[offset : offset + rows.num_rows]
        offset += rows.num_rows
        first = rows.first_position
        targets = rows.seq.token_ids[first : first + rows.num_rows]
        index = torch.tensor(targets, device=logprobs.device)[:, None]
        result = worker_pb2.PromptLogprobs(
            seq_id=rows.seq.seq_id,
            first_position=first,
            logprobs=logprobs.gather(1, index)[:, 0].tolist(),
        )
        num_top = rows.seq.prompt_logprobs
        if num_top:
            top_values, top_ids = logprobs.topk(num_top, dim=-1)
            result.num_top = num_top
            result.top_token_ids.extend(top_ids.flatten().tolist())
            result.top_logprobs.extend(top_values.flatten().tolist())
        results.append(result)
    return results
