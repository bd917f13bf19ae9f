"""One step's adapters, row by row of the flat batch (step/flat_batch.py).

`row_slots` is the slot (lora/slots.py) of each row, 0 for the base: what a per-row
kernel reads (the native decode step). `groups` is the same rows gathered by slot, one
entry per distinct adapter of the step: what the segmented matmul of the float and
block paths reads, one `x[rows] @ a.T @ b.T` per adapter (Punica's / S-LoRA's shape of
the work). Base rows are in no group, so a step of base rows only computes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraBatch:
    row_slots: torch.Tensor  # int32 [T], contiguous; 0: the base
    # (slot, int64 row indices into the flat batch) for each distinct non-zero slot, in
    # increasing slot order.
    groups: tuple[tuple[int, torch.Tensor], ...]
    # Per group, (start, stop) where its rows are one contiguous run of the batch (one
    # sequence, or every row on one adapter), else None: a run is read and added as a
    # view, without a gather or a scatter.
    spans: tuple[tuple[int, int] | None, ...] = ()

    @classmethod
    def from_row_slots(cls, row_slots: torch.Tensor) -> LoraBatch:
        row_slots = row_slots.to(torch.int32).contiguous()
        groups = tuple(
            (slot, torch.nonzero(row_slots == slot).flatten())
            for slot in sorted(set(row_slots.tolist()) - {0})
        )
        return cls(row_slots, groups, tuple(_span(rows) for _, rows in groups))

    @classmethod
    def from_sequences(cls, slots_and_rows: Iterable[tuple[int, int]]) -> LoraBatch:
        """From (slot, number of rows) of each row group of the flat batch, in the
        batch's row order."""
        slots: list[int] = []
        for slot, num_rows in slots_and_rows:
            if slot < 0 or num_rows < 0:
                raise ValueError(f"a slot and a row count are not negative: {slot}, {num_rows}")
            slots.extend([slot] * num_rows)
        if not any(slots):
            return cls.base(len(slots))
        return cls.from_row_slots(torch.tensor(slots, dtype=torch.int32))

    @classmethod
    def base(cls, num_rows: int) -> LoraBatch:
        """A step of base rows only."""
        return cls(torch.zeros(num_rows, dtype=torch.int32), ())

    @property
    def is_empty(self) -> bool:
        """Every row is the base: nothing to add, nothing to compute."""
        return not self.groups

    @property
    def num_rows(self) -> int:
        return self.row_slots.shape[0]

    @property
    def slots(self) -> tuple[int, ...]:
        """The distinct adapters of the step (base excluded)."""
        return tuple(slot for slot, _ in self.groups)

    def to(self, device: torch.device | str) -> LoraBatch:
        """The same batch with its tensors on `device` (itself where they are)."""
        if self.row_slots.device == torch.device(device):
            return self
        groups = tuple((slot, rows.to(device)) for slot, rows in self.groups)
        return LoraBatch(self.row_slots.to(device), groups, self.spans)

    def kept(self, keep_rows: torch.Tensor) -> LoraBatch:
        """The batch restricted to `keep_rows` (the last layer's o_proj and MLP run only
        on the sampled rows), rows renumbered in `keep_rows`' order."""
        if self.is_empty:
            return LoraBatch.base(keep_rows.shape[0])
        return LoraBatch.from_row_slots(self.row_slots[keep_rows])


def _span(rows: torch.Tensor) -> tuple[int, int] | None:
    """(first, last + 1) of increasing row indices with no gap, else None."""
    first, last = int(rows[0]), int(rows[-1])
    return (first, last + 1) if last - first + 1 == rows.shape[0] else None
