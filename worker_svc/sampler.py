"""Token sampling for a whole batch of rows at once.

Order per row (as in vLLM): the allowed-token mask of a constrained row
(structured outputs, token_bitmask.py); logprobs are taken there, from the model's
logits with only that mask applied (a banned token's logprob is -inf); then
repetition, frequency and presence penalties; the min_tokens ban; greedy rows
take the argmax; the others divide by temperature, apply min_p, top_k, top_p
and draw with the exponential race: argmax(probs / E) with E ~ Exp(1) per
token picks token i with probability probs[i], in one vector op per row.

Seeded rows must draw the same token whatever else is in the batch and after
a recompute, so their noise comes from a generator re-seeded per token from
(seed, output index); nothing about the batch enters it. Unseeded rows share
one batched draw from the sampler's own generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from common.sampling_params import SamplingParams
from worker_svc.token_bitmask import apply_allowed_tokens

_MASK64 = (1 << 64) - 1


def seed_for_token(seed: int, output_index: int) -> int:
    """A 64-bit seed for one token, mixed (splitmix64) so that nearby pairs are unrelated."""
    z = (seed + (output_index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class PenaltyCounts:
    """Per-sequence token statistics for penalties, updated as tokens are appended.

    Kept only for sequences that use a penalty, so that a step stacks ready
    vectors instead of re-counting every token of every sequence.
    """

    def __init__(
        self, vocab_size: int, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ):
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool)
        if prompt_token_ids:
            self.prompt_mask[torch.tensor(list(prompt_token_ids), dtype=torch.long)] = True
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)
        if output_token_ids:
            ids = torch.tensor(list(output_token_ids), dtype=torch.long)
            self.output_counts.index_add_(0, ids, torch.ones(len(ids)))

    def append(self, token_id: int) -> None:
        self.output_counts[token_id] += 1


class SamplingRow(Protocol):
    """What the sampler needs to know about the sequence behind one logits row."""

    @property
    def sampling(self) -> SamplingParams: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def penalties(self) -> PenaltyCounts | None: ...


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    # One entry per row; None where the row asked for no logprobs.
    logprobs: list[TokenLogprobs | None]


def row_argmax(values: torch.Tensor) -> torch.Tensor:
    """Each row's first largest index (torch.argmax's answer), by numpy on the CPU: torch
    2.13's CPU argmax over a vocabulary runs one thread without vector code, 43 us for
    one row of 49,152 and 1.5 ms for 64 where numpy takes 5 us and 0.2 ms (Zen 4). A
    NaN is the largest in both."""
    if values.device.type != "cpu" or values.dtype != torch.float32:
        return values.argmax(-1)
    return torch.from_numpy(values.contiguous().numpy().argmax(-1))


def _rows(mask: list[bool], device: torch.device) -> torch.Tensor:
    return torch.tensor([i for i, m in enumerate(mask) if m], dtype=torch.long, device=device)


def apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """In place, on the rows that use a penalty (vLLM semantics)."""
    idx = _rows([r.sampling.uses_penalties for r in rows], logits.device)
    if idx.numel() == 0:
        return
    used = [rows[i] for i in idx.tolist()]
    counts = torch.stack([r.penalties.output_counts for r in used]).to(logits.device)
    seen = torch.stack([r.penalties.prompt_mask for r in used]).to(logits.device) | (counts > 0)

    def column(name: str) -> torch.Tensor:
        values = [getattr(r.sampling, name) for r in used]
        return torch.tensor(values, device=logits.device)[:, None]

    rep = column("repetition_penalty")
    sub = logits[idx]
    # Repetition: over prompt and output tokens, divide positive logits and multiply negative.
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    # Frequency and presence: over output tokens only.
    sub -= column("frequency_penalty") * counts
    sub -= column("presence_penalty") * (counts > 0)
    logits[idx] = sub


def apply_min_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """In place: ban the given ids on rows that have fewer than min_tokens outputs."""
    row_idx: list[int] = []
    col_idx: list[int] = []
    for i, r in enumerate(rows):
        if _min_tokens_ban_in_force(r):
            row_idx.extend([i] * len(r.sampling.min_tokens_banned_ids))
            col_idx.extend(r.sampling.min_tokens_banned_ids)
    if row_idx:
        rows_t = torch.tensor(row_idx, device=logits.device)
        cols_t = torch.tensor(col_idx, device=logits.device)
        logits[rows_t, cols_t] = float("-inf")


def _min_tokens_ban_in_force(row: SamplingRow) -> bool:
    """Whether the row still bans its min_tokens ids (fewer outputs than min_tokens)."""
    sampling = row.sampling
    return bool(row.num_output_tokens < sampling.min_tokens and sampling.min_tokens_banned_ids)


def _argmax_only(row: SamplingRow) -> bool:
    """A greedy row with no penalty, no min_tokens ban in force and no logprobs."""
    sampling = row.sampling
    if not sampling.greedy or sampling.uses_penalties or sampling.logprobs > 0:
        return False
    return not _min_tokens_ban_in_force(row)


def _truncate(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """min_p, then top_k and top_p (one sort for both), for already temperature-scaled rows."""
    device = logits.device
    min_p = torch.tensor([r.sampling.min_p for r in rows], device=device)
    if bool((min_p > 0).any()):
        probs = logits.softmax(-1)
        threshold = probs.amax(-1, keepdim=True) * min_p[:, None]
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    use_k = any(r.sampling.uses_top_k for r in rows)
    use_p = any(r.sampling.top_p < 1 for r in rows)
    if not (use_k or use_p):
        return logits
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True)
    if use_k:
        k = [r.sampling.top_k if r.sampling.uses_top_k else vocab for r in rows]
        ranks = torch.arange(vocab, device=device)[None, :]
        ordered.masked_fill_(ranks >= torch.tensor(k, device=device)[:, None], float("-inf"))
    if use_p:
        # Disabled rows get a bound no cumulative sum reaches, even with rounding.
        p = [r.sampling.top_p if r.sampling.top_p < 1 else 2.0 for r in rows]
        p = torch.tensor(p, device=device)
        probs = ordered.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        ordered.masked_fill_(probs.cumsum(-1) - probs > p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, ordered)


class Sampler:
    """Samples on the device the logits are on.

    Seeded rows draw their noise on the CPU, so that a seed gives the same noise
    on every kind of worker; unseeded rows draw on the logits' device.
    """

    def __init__(self, device: torch.device | str = "cpu", seed: int | None = None):
        self.device = torch.device(device)
        self._batch_generator = torch.Generator(device=self.device)
        if seed is None:
            self._batch_generator.seed()
        else:
            self._batch_generator.manual_seed(seed)
        self._row_generator = torch.Generator()

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        allowed: list[np.ndarray | None] | None = None,
    ) -> SamplerOutput:
        """logits `[len(rows), vocab]`; the caller's tensor is not modified. allowed: per
        row, the plan's mask words of a constrained row, or None."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sampling rows")
        raw = logits.float().to(self.device)
        if allowed is None and all(_argmax_only(r) for r in rows):
            # Nothing to apply and no logprobs: the general path's copy of the logits
            # (12.6 MB a step at 64 rows of a 49,152 vocabulary) would change nothing.
            return SamplerOutput(row_argmax(raw).tolist(), [None] * len(rows))
        if allowed is not None:
            # Logprobs come from the masked logits, as in vLLM (which masks the logits
            # before its sampler): a constrained row's are over the allowed tokens.
            raw = raw.clone() if raw is logits else raw
            apply_allowed_tokens(raw, allowed)
        processed = raw.clone()
        apply_penalties(processed, rows)
        apply_min_tokens(processed, rows)
        tokens = row_argmax(processed)

        random_mask = [not r.sampling.greedy for r in rows]
        if any(random_mask):
            idx = _rows(random_mask, self.device)
            sub_rows = [rows[i] for i in idx.tolist()]
            temperature = [r.sampling.temperature for r in sub_rows]
            temperature = torch.tensor(temperature, device=self.device)[:, None]
            probs = _truncate(processed[idx] / temperature, sub_rows).softmax(-1)
            tokens[idx] = row_argmax(probs / self._exponential_noise(probs, sub_rows))

        return SamplerOutput(tokens.tolist(), self._logprobs(raw, tokens, rows))

    def _exponential_noise(self, probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        if any(r.sampling.seed is None for r in rows):
            noise.exponential_(generator=self._batch_generator)
        for i, r in enumerate(rows):
            if r.sampling.seed is not None:
                self._row_generator.manual_seed(
                    seed_for_token(r.sampling.seed, r.num_output_tokens)
                )
                row = torch.empty(probs.shape[-1], dtype=probs.dtype)
                noise[i] = row.exponential_(generator=self._row_generator).to(noise.device)
        # An exact 0 would turn a zero-probability token into 0/0 = NaN, which argmax picks.
        return noise.clamp_min_(torch.finfo(noise.dtype).tiny)

    @staticmethod
    def _logprobs(
        raw: torch.Tensor, tokens: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> list[TokenLogprobs | None]:
        result: list[TokenLogprobs | None] = [None] * len(rows)
        idx = _rows([r.sampling.logprobs > 0 for r in rows], raw.device)
        if idx.numel() == 0:
            return result
        logprobs = raw[idx].log_softmax(-1)
        chosen = logprobs.gather(1, tokens[idx][:, None])[:, 0].tolist()
        max_k = min(max(rows[i].sampling.logprobs for i in idx.tolist()), raw.shape[-1])
        top_values, top_ids = logprobs.topk(max_k, dim=-1)
        for j, i in enumerate(idx.tolist()):
            k = min(rows[i].sampling.logprobs, max_k)
            result[i] = TokenLogprobs(
                logprob=chosen[j],
                top_token_ids=top_ids[j, :k].tolist(),
                top_logprobs=top_values[j, :k].tolist(),
            )
        return result
