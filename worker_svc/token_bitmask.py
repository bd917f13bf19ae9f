"""A plan's allowed-token bitmask (structured outputs), read and applied on the worker.

The scheduler sends one blob for all constrained rows of a step (worker.proto's
TokenBitmask): a row of ceil(vocab / 32) little-endian 32-bit words per sequence,
bit b of word w allowing token 32 * w + b. Ids past the row (a model vocabulary
padded beyond the tokenizer's) are not allowed. The sampler applies a row to its
sequence's logits before penalties, min_tokens, temperature and top-k/top-p, so
those only ever choose among allowed tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.errors import PlanError


def read_allowed_tokens(plan: worker_pb2.StepPlan) -> dict[int, np.ndarray]:
    """seq_id -> its mask row (int32 words); raises PlanError for a malformed mask."""
    mask = plan.allowed_tokens
    if not mask.seq_ids:
        if mask.words:
            raise PlanError("allowed_tokens has words but no seq_ids")
        return {}
    if max(plan.num_steps, 1) > 1:
        raise PlanError(f"a plan of {plan.num_steps} steps has allowed_tokens: one step only")
    num_rows = len(mask.seq_ids)
    if not mask.words or len(mask.words) % (4 * num_rows):
        raise PlanError(f"allowed_tokens: {len(mask.words)} bytes are not {num_rows} rows of words")
    planned = {s.seq_id for s in plan.new_sequences} | {s.seq_id for s in plan.continuing_sequences}
    rows = np.frombuffer(mask.words, dtype="<i4").reshape(num_rows, -1).astype(np.int32)
    allowed = {}
    for seq_id, row in zip(mask.seq_ids, rows, strict=True):
        if seq_id not in planned or seq_id in allowed:
            raise PlanError(f"allowed_tokens: sequence {seq_id} is not in the plan, or twice")
        allowed[seq_id] = row
    return allowed


def allowed_ids(row: np.ndarray) -> np.ndarray:
    """The token ids a row allows, ascending (numpy only: the null runner's path)."""
    return np.flatnonzero(np.unpackbits(row.astype("<i4").view(np.uint8), bitorder="little"))


def apply_allowed_tokens(logits: torch.Tensor, rows: list[np.ndarray | None]) -> None:
    """In place: -inf for every token a row's mask does not allow; None rows are free."""
    masked = [i for i, row in enumerate(rows) if row is not None]
    if not masked:
        return
    device = logits.device
    words = torch.from_numpy(np.stack([rows[i] for i in masked])).to(device)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).reshape(len(masked), -1).bool()
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    index = torch.tensor(masked, device=device)
    logits[index] = logits[index].masked_fill(~allowed[:, :vocab], float("-inf"))
