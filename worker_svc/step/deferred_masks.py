"""Deferred masks: the allowed-token rows that follow their plan (async scheduling).

A constrained sequence planned ahead of its pending sample cannot have its mask in
the plan: the mask depends on the token the step before samples, which only the
scheduler's grammar can read. The plan lists it (Step.deferred_mask_seq_ids); the
scheduler sends the rows in a message of their own once it has taken that token,
and the worker's forward does not wait for them: only its sampler does (vLLM's
deferred sample_tokens, SGLang's wait on sampling_info_done).

Two threads meet here. The event loop posts the messages as the Step stream reads
them (MaskMailbox.post); the forward thread, between forward and sampling, waits for
its step's message (StepMasks.rows). A message that does not come within the plan's
timeout, or that lacks a row, leaves those rows unmasked: they sample freely and are
reported (StepResult.mask_missing_seq_ids), so the scheduler fails those requests
and the worker and every other row go on.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import structlog

from cbserve.worker.v1 import worker_pb2 as wpb
from worker_svc.errors import PlanError
from worker_svc.token_bitmask import DraftRows, read_mask

log = structlog.get_logger("worker_svc.deferred_masks")

# The sampler's wait when a plan does not say (a scheduler that sets no timeout).
DEFAULT_TIMEOUT_S = 5.0
# Messages kept for steps not run yet; more means a scheduler that sends masks for
# plans that never come: the oldest are dropped.
MAX_WAITING_MESSAGES = 16


class MaskMailbox:
    """Deferred-mask messages by step id, from the event loop to the forward thread."""

    def __init__(self) -> None:
        self._arrived = threading.Condition()
        self._messages: dict[int, wpb.TokenBitmask] = {}
        # The Step stream the messages belong to (servicer.py numbers them).
        self._stream = 0

    def reset(self, stream: int) -> None:
        """A new stream: what an older one sent is stale."""
        with self._arrived:
            self._stream = stream
            self._messages.clear()

    def post(self, stream: int, message: wpb.StepPlan) -> None:
        """A message carrying deferred_allowed_tokens, as the stream read it."""
        with self._arrived:
            if stream != self._stream:
                return
            self._messages[message.step_id] = message.deferred_allowed_tokens
            while len(self._messages) > MAX_WAITING_MESSAGES:
                self._messages.pop(next(iter(self._messages)))
            self._arrived.notify_all()

    def take(self, step_id: int, timeout_s: float) -> wpb.TokenBitmask | None:
        """The message for step_id, waiting up to timeout_s; None if it did not come.
        Messages of earlier steps (late ones) are dropped with it."""
        with self._arrived:
            self._arrived.wait_for(lambda: step_id in self._messages, timeout_s)
            for older in [s for s in self._messages if s < step_id]:
                del self._messages[older]
            return self._messages.pop(step_id, None)


class StepMasks:
    """The allowed-token rows one step's sampler applies: those that came in the plan,
    and those its deferred message brings (waited for on first use)."""

    def __init__(
        self,
        step_id: int,
        inline: Mapping[int, np.ndarray],
        deferred: Collection[int] = (),
        mailbox: MaskMailbox | None = None,
        timeout_s: float = 0.0,
        inline_draft_rows: Mapping[int, DraftRows] = MappingProxyType({}),
    ) -> None:
        self.step_id = step_id
        self._rows = inline
        self._draft_rows = inline_draft_rows
        self._deferred = deferred
        self._mailbox = mailbox
        self._timeout_s = timeout_s if timeout_s > 0 else DEFAULT_TIMEOUT_S
        # Deferred rows that never came: filled in by rows().
        self.missing: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._rows or self._deferred)

    @property
    def waits(self) -> bool:
        """Whether rows() will wait for a deferred message."""
        return bool(self._deferred)

    def rows(self) -> Mapping[int, np.ndarray]:
        """seq_id -> (first) row; waits once for the deferred rows, if any."""
        if self._deferred:
            deferred, self._deferred = self._deferred, ()
            first, drafting = self._arrived_rows(deferred)
            self._rows = {**self._rows, **first}
            if drafting:
                self._draft_rows = {**self._draft_rows, **drafting}
            self.missing = [sid for sid in deferred if sid not in self._rows]
        return self._rows

    def position_rows(self, seq_id: int, drafts: Sequence[int]) -> list[np.ndarray] | None:
        """The rows a sequence that verifies `drafts` (its own) samples its positions
        with, one per position it may emit (1 to 1 + len(drafts)): where the scheduler
        masked draft positions (token_bitmask.DraftRows), those whose rows followed
        these very drafts; else its one row. None where it is not masked. After rows()."""
        first = self._rows.get(seq_id)
        if first is None:
            return None
        extra = self._draft_rows.get(seq_id)
        if extra is None or not drafts:
            return [first]
        return [first, *extra.rows[1 : extra.usable_positions(drafts)]]

    def _arrived_rows(
        self, deferred: Collection[int]
    ) -> tuple[dict[int, np.ndarray], dict[int, DraftRows]]:
        message = self._mailbox.take(self.step_id, self._timeout_s) if self._mailbox else None
        if message is None:
            # Rows left out of a message that came are no news (their requests ended
            # meanwhile, as a row does at its forced EOS); a message that never came is.
            log.warning(
                "deferred_masks_missing",
                step_id=self.step_id,
                seq_ids=sorted(deferred),
                waited_s=self._timeout_s,
            )
            return {}, {}
        if not message.seq_ids:
            return {}, {}
        try:
            first, drafting = read_mask(message)
        except PlanError as error:  # a malformed message: its rows count as missing
            log.warning("deferred_masks_malformed", step_id=self.step_id, error=str(error))
            return {}, {}
        first = {sid: row for sid, row in first.items() if sid in deferred}
        return first, {sid: rows for sid, rows in drafting.items() if sid in first}


# A step without masks: what multi-step's later steps use.
UNMASKED = StepMasks(0, MappingProxyType({}))
