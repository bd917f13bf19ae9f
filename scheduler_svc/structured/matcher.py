"""One request's position in its grammar, kept in step with its accepted tokens.

The matcher has consumed exactly the request's output tokens: the scheduler
advances it with each token it appends (token_intake.take_tokens) and never with a
token it drops (a result for a preempted or finished request). `sync` checks that
and rebuilds from the output tokens if not, so a request recomputed on any worker
(after a preemption, or moved after a worker loss) masks from the right state.

Many rows of a step are filled at once by llguidance's own thread pool
(fill_mask_rows): the matchers compute in parallel, outside the GIL, while the
scheduler's thread waits, instead of one row after the other.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import llguidance
import numpy as np

# From this many rows on, a step's masks are filled by llguidance's pool: below it,
# handing rows to the pool costs more than filling them here. Measured on rows of
# bench/scheduler/load.py's JSON schema (2-core Zen 4, shared): 4 rows 0.053 ms here,
# 0.064 by the pool; 24 rows 0.30 / 0.25 ms; 64 rows 0.80 / 0.59 ms.
PARALLEL_MIN_ROWS = 8
_executor: llguidance.LLExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> llguidance.LLExecutor:
    """llguidance's pool, made once per process (its threads live as long)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = llguidance.LLExecutor()
        return _executor


class RequestMatcher:
    def __init__(
        self, template: llguidance.LLMatcher, num_words: int, constraint: object = None
    ) -> None:
        # What it was compiled from (a Constraint): what an API process sends its core,
        # which compiles it again in its own cache (split/core_side.py).
        self.constraint = constraint
        # The compiled grammar's start state, shared with other requests: never advanced.
        self._template = template
        self._matcher = template.deep_copy()
        self.num_words = num_words
        # Output tokens consumed so far.
        self.num_tokens = 0

    def advance(self, token_id: int) -> bool:
        """Consumes one accepted token; False if the grammar does not allow it (the
        matcher is then in an error state for good)."""
        self.num_tokens += 1
        return self._matcher.consume_token(token_id)

    def sync(self, output_token_ids: list[int]) -> bool:
        """Makes the matcher's state that after output_token_ids; True if it had to be
        rebuilt (from a fresh copy: an llguidance matcher never leaves an error state)."""
        if self.num_tokens == len(output_token_ids) and not self._matcher.is_error():
            return False
        self._matcher = self._template.deep_copy()
        self._matcher.consume_tokens(list(output_token_ids))
        self.num_tokens = len(output_token_ids)
        return True

    @property
    def is_accepting(self) -> bool:
        """The text so far is complete under the grammar."""
        return self._matcher.is_accepting()

    @property
    def must_end(self) -> bool:
        """The grammar allows nothing but EOS next (or has taken it): the reply is complete
        and any further token could only be EOS or break it."""
        return self._matcher.is_stopped()

    @property
    def is_error(self) -> bool:
        return self._matcher.is_error()

    @property
    def error(self) -> str:
        return self._matcher.get_error()

    def fill_mask(self, row: np.ndarray) -> None:
        """Writes the allowed next tokens into row (num_words int32, C-contiguous)."""
        if row.dtype != np.int32 or row.shape != (self.num_words,) or not row.flags.c_contiguous:
            raise ValueError(f"a mask row is {self.num_words} contiguous int32 words")
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def fill_masks_after_drafts(self, drafts: Sequence[int], rows: np.ndarray) -> int:
        """Row j of rows gets the allowed tokens after drafts[:j] (speculative decoding:
        the rows a constrained sequence's draft positions sample with); returns how many
        rows it filled, 1 to 1 + len(drafts). It stops at a draft the grammar forbids
        (the row before it, filled, forbids it: that draft is surely rejected) and after
        one that leaves nothing but EOS (the request ends there). The matcher is rolled
        back to where it was: the drafts are never taken, only looked through, and a
        forbidden one is never fed to it (that would leave it in an error state)."""
        self.fill_mask(rows[0])
        filled = consumed = 0
        try:
            for filled, draft in enumerate(drafts, start=1):
                if not token_allowed(rows[filled - 1], draft):
                    return filled
                if not self._matcher.consume_token(draft):
                    raise RuntimeError(f"the grammar refused draft {draft} its mask allows")
                consumed += 1
                if self._matcher.is_stopped():
                    return filled
                self.fill_mask(rows[filled])
            return 1 + len(drafts)
        finally:
            if consumed:
                self._matcher.rollback(consumed)


def token_allowed(row: np.ndarray, token_id: int) -> bool:
    """Whether a mask row's bit for token_id is set."""
    word = token_id >> 5
    return 0 <= word < len(row) and bool((int(row[word]) >> (token_id & 31)) & 1)


def fill_mask_rows(
    matchers: Sequence[RequestMatcher], rows: np.ndarray, indices: Sequence[int]
) -> None:
    """Row indices[i] of rows (C-contiguous int32, [rows, num_words]) gets the allowed
    next tokens of matchers[i]: by llguidance's pool when there are many."""
    if rows.dtype != np.int32 or not rows.flags.c_contiguous or len(indices) != len(matchers):
        raise ValueError(f"mask rows are C-contiguous int32, one per matcher ({len(matchers)})")
    if len(matchers) < PARALLEL_MIN_ROWS:
        for index, matcher in zip(indices, matchers, strict=True):
            matcher.fill_mask(rows[index])
        return
    num_words = rows.shape[1]
    if any(matcher.num_words != num_words for matcher in matchers):
        raise ValueError(f"matcher rows must have {num_words} words")
    if min(indices) < 0 or max(indices) >= len(rows):
        raise ValueError(f"row indices out of range (0..{len(rows) - 1})")
    pairs = [(matcher._matcher, index) for index, matcher in zip(indices, matchers, strict=True)]
    _pool().unsafe_compute_mask_ptr(pairs, rows.ctypes.data, num_words * 4, len(rows))
