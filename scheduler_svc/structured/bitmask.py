"""The allowed-token bitmask of one plan: a row per constrained sequence that samples,
or one per position for a constrained sequence that verifies drafts.

The scheduler adds sequences as it builds the plan (or, for deferred rows, once the
result before it is taken), then fills every single row at once (`fill`: by
llguidance's threads when there are many, matcher.fill_mask_rows) into one int32
buffer that grows by doubling; `words` is that buffer's bytes, the one blob the
worker protocol carries (worker.proto's TokenBitmask says why one blob).

A drafting sequence's rows (`add_drafting`) are filled when added: each follows the
drafts before it, so its matcher is walked through them and rolled back at once
(matcher.fill_masks_after_drafts), one row after the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler_svc.structured.matcher import RequestMatcher, fill_mask_rows

_INITIAL_ROWS = 8


class TokenBitmask:
    def __init__(self, num_words: int) -> None:
        if num_words < 1:
            raise ValueError(f"num_words must be >= 1, got {num_words}")
        self.num_words = num_words
        self.seq_ids: list[int] = []
        # Parallel to seq_ids: how many consecutive rows each has (worker.proto's
        # row_counts), and the drafts the rows after a sequence's first follow.
        self.row_counts: list[int] = []
        self.draft_token_ids: list[int] = []
        self._rows = np.empty((_INITIAL_ROWS, num_words), dtype=np.int32)
        self._num_rows = 0
        # Single rows added and not filled yet: their matchers and row indices.
        self._unfilled: list[RequestMatcher] = []
        self._unfilled_at: list[int] = []

    def __len__(self) -> int:
        return len(self.seq_ids)

    @property
    def has_drafts(self) -> bool:
        """Some sequence has more than one row (the protocol's row_counts is needed)."""
        return self._num_rows > len(self.seq_ids)

    def add(self, seq_id: int, matcher: RequestMatcher) -> None:
        """The row of a sequence that samples in this plan, from its matcher's state at
        the next fill(): nothing may advance the matcher before that."""
        self._check(matcher)
        self._unfilled.append(matcher)
        self._unfilled_at.append(self._reserve(seq_id, 1))

    def add_drafting(self, seq_id: int, matcher: RequestMatcher, drafts: Sequence[int]) -> int:
        """The rows of a sequence that verifies `drafts` after the matcher's state: row j
        after drafts[:j], up to the first draft the grammar forbids or after one that
        completes it; returns how many rows it got. Filled now (the matcher ends where
        it was)."""
        self._check(matcher)
        at = self._reserve(seq_id, 1 + len(drafts))
        filled = matcher.fill_masks_after_drafts(drafts, self._rows[at : at + 1 + len(drafts)])
        self._num_rows = at + filled
        self.row_counts[-1] = filled
        self.draft_token_ids.extend(drafts[: filled - 1])
        return filled

    def fill(self) -> TokenBitmask:
        """Fills the single rows added since the last fill, all at once; returns self."""
        if self._unfilled:
            fill_mask_rows(self._unfilled, self._rows, self._unfilled_at)
            self._unfilled, self._unfilled_at = [], []
        return self

    @property
    def rows(self) -> np.ndarray:
        """The rows, filled first if some are not (the scheduler fills them as soon as
        its plan or deferred message is complete, before any matcher moves on)."""
        return self.fill()._rows[: self._num_rows]

    def rows_of(self, seq_id: int) -> np.ndarray:
        """The rows of one sequence (one, or one per draft position)."""
        index = self.seq_ids.index(seq_id)
        start = sum(self.row_counts[:index])
        return self.rows[start : start + self.row_counts[index]]

    @property
    def words(self) -> bytes:
        """The rows, little-endian, as the protocol carries them."""
        return self.rows.astype("<i4", copy=False).tobytes()

    def _check(self, matcher: RequestMatcher) -> None:
        if matcher.num_words != self.num_words:
            raise ValueError(f"matcher rows have {matcher.num_words} words, not {self.num_words}")

    def _reserve(self, seq_id: int, num_rows: int) -> int:
        """Room for num_rows more rows; the index of the first."""
        at = self._num_rows
        if at + num_rows > len(self._rows):
            grown = np.empty((max(2 * len(self._rows), at + num_rows), self.num_words), np.int32)
            grown[:at] = self._rows[:at]
            self._rows = grown
        self._num_rows = at + num_rows
        self.seq_ids.append(seq_id)
        self.row_counts.append(num_rows)
        return at


def allowed_ids(row: np.ndarray) -> np.ndarray:
    """The token ids a mask row allows (for tests and the null runner's reference)."""
    bits = np.unpackbits(row.astype("<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)
