"""Prompt lookup (vLLM's `ngram` method, llama.cpp's ngram drafts): the draft after a
sequence's tokens is what followed the last earlier occurrence of their longest suffix
of min_n..max_n tokens.

The worker proposes with it (with async scheduling the scheduler plans step N+1
before step N's token is back, so only the worker knows the token a draft must
follow). The scheduler runs the same code for a constrained sequence when it builds
its mask rows (scheduler_svc/structured/draft_masks.py): once it has taken the token
a draft follows, the proposal is a function of the tokens and (k, min_n, max_n)
alone, so it knows the worker's drafts and masks each position after them. Why an index:
searching the whole sequence for each suffix every step costs O(length) Python per
row; a dict from each n-gram to where it last ended is kept up to date with each
appended token (O(max_n - min_n + 1) per token), and a lookup is a few dict probes.

The most recent occurrence is the one taken (llama.cpp's choice too): in an edit or a
summary the text being repeated is the one just before.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a token list last ended, counting only
    n-grams that something followed: the key tokens[e - n:e] maps to e < len(tokens)."""

    __slots__ = ("min_n", "max_n", "_ends", "_indexed")

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._ends: dict[tuple[int, ...], int] = {}
        # Ends e below this are indexed: every n-gram ending at e, with tokens[e] after it.
        self._indexed = 0

    def catch_up(self, tokens: Sequence[int]) -> None:
        """Indexes the n-grams that gained a following token since the last call."""
        ends = self._ends
        for end in range(max(self._indexed, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                ends[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, len(tokens))

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k draft tokens to follow `tokens` (empty when no suffix occurred before)."""
        if k <= 0:
            return []
        self.catch_up(tokens)
        length = len(tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self._ends.get(tuple(tokens[length - n :]))
            if end is not None:
                return list(tokens[end : min(end + k, length)])
        return []
