"""The allowed-token bitmask of one plan: a row per constrained sequence that samples.

The scheduler adds sequences as it builds the plan (or, for deferred rows, once the
result before it is taken), then fills every row at once (`fill`: by llguidance's
threads when there are many, matcher.fill_mask_rows) into one int32 buffer that
grows by doubling; `words` is that buffer's bytes, the one blob the worker protocol
carries (worker.proto's TokenBitmask says why one blob).
"""

from __future__ import annotations

import numpy as np

from scheduler_svc.structured.matcher import RequestMatcher, fill_mask_rows

_INITIAL_ROWS = 8


class TokenBitmask:
    def __init__(self, num_words: int) -> None:
        if num_words < 1:
            raise ValueError(f"num_words must be >= 1, got {num_words}")
        self.num_words = num_words
        self.seq_ids: list[int] = []
        self._rows = np.empty((_INITIAL_ROWS, num_words), dtype=np.int32)
        # Matchers of the rows added and not filled yet, from row _num_filled on.
        self._unfilled: list[RequestMatcher] = []
        self._num_filled = 0

    def __len__(self) -> int:
        return len(self.seq_ids)

    def add(self, seq_id: int, matcher: RequestMatcher) -> None:
        """The row of a sequence that samples in this plan, from its matcher's state at
        the next fill(): nothing may advance the matcher before that."""
        if matcher.num_words != self.num_words:
            raise ValueError(f"matcher rows have {matcher.num_words} words, not {self.num_words}")
        index = len(self.seq_ids)
        if index == len(self._rows):
            grown = np.empty((2 * index, self.num_words), dtype=np.int32)
            grown[:index] = self._rows
            self._rows = grown
        self._unfilled.append(matcher)
        self.seq_ids.append(seq_id)

    def fill(self) -> TokenBitmask:
        """Fills the rows added since the last fill, all at once; returns self."""
        if self._unfilled:
            fill_mask_rows(self._unfilled, self._rows[self._num_filled :])
            self._num_filled += len(self._unfilled)
            self._unfilled = []
        return self

    @property
    def rows(self) -> np.ndarray:
        """The rows, filled first if some are not (the scheduler fills them as soon as
        its plan or deferred message is complete, before any matcher moves on)."""
        return self.fill()._rows[: len(self.seq_ids)]

    @property
    def words(self) -> bytes:
        """The rows, little-endian, as the protocol carries them."""
        return self.rows.astype("<i4", copy=False).tobytes()


def allowed_ids(row: np.ndarray) -> np.ndarray:
    """The token ids a mask row allows (for tests and the null runner's reference)."""
    bits = np.unpackbits(row.astype("<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)
