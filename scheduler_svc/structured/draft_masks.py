"""Mask rows for a constrained sequence that verifies drafts (speculative decoding).

The worker proposes a sequence's drafts itself (common/ngram.py), after the token it
sampled last; the grammar is the scheduler's. Whenever the scheduler builds a
constrained row's mask, in the plan (no sample pending) or in the deferred message
(after the result before the plan is taken), it holds every token the worker's
drafts will follow, and the proposal is a function of those tokens and (k, min_n,
max_n) alone: so it runs the same lookup over the same tokens, keeping an index per
request as the worker keeps one per sequence, and gets the very drafts the worker
verifies. It then sends a row per position: row j the allowed tokens after the
first j drafts (TokenBitmask.add_drafting), with the drafts it assumed, so that the
worker emits only tokens whose row followed the drafts it really had.

The request's matcher only looks through the drafts (and is rolled back): it takes
a token only when the result brings it (token_intake.py), accepted ones only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.ngram import NgramIndex
from scheduler_svc.structured.bitmask import TokenBitmask

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request


def add_drafting_rows(
    mask: TokenBitmask, request: Request, num_drafts: int, lookup: tuple[int, int]
) -> int:
    """Adds the rows of a constrained request that may verify num_drafts drafts, its
    matcher synced to its output first; returns how many rows it got."""
    matcher = request.structured
    matcher.sync(request.output_token_ids)
    drafts = predicted_drafts(request, num_drafts, lookup)
    if not drafts:  # the worker finds none either: one row, filled with the others
        mask.add(request.seq_id, matcher)
        return 1
    return mask.add_drafting(request.seq_id, matcher, drafts)


def predicted_drafts(request: Request, k: int, lookup: tuple[int, int]) -> list[int]:
    """The drafts the worker proposes after the request's tokens (prompt and output)."""
    index = request.ngram_index
    if index is None or (index.min_n, index.max_n) != lookup:
        index = request.ngram_index = NgramIndex(*lookup)
    return index.propose(JoinedTokens(request.prompt_token_ids, request.output_token_ids), k)


class JoinedTokens(Sequence[int]):
    """prompt + output as one sequence, without copying either (the lookup slices it)."""

    __slots__ = ("_prompt", "_output")

    def __init__(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        self._prompt, self._output = prompt, output

    def __len__(self) -> int:
        return len(self._prompt) + len(self._output)

    def __getitem__(self, key):
        split = len(self._prompt)
        if isinstance(key, int):
            if key < 0:
                key += len(self)
            return self._prompt[key] if key < split else self._output[key - split]
        start, stop, step = key.indices(len(self))
        if step != 1:
            return [self[i] for i in range(start, stop, step)]
        if stop <= split:
            return list(self._prompt[start:stop])
        if start >= split:
            return list(self._output[start - split : stop - split])
        return [*self._prompt[start:], *self._output[: stop - split]]
