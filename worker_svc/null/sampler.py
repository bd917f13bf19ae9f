"""The null model's sampler: real token ids of the served tokenizer, with no logits.

The scheduler detokenizes, checks stop strings and streams whatever ids it gets back,
so their cost there is only real if the ids are: a random choice among the
vocabulary's ordinary text tokens (no special tokens, no partial UTF-8 byte pieces
that the detokenizer would hold back) makes text of the usual mix of word pieces.
EOS comes only with the probability asked for, and never before min_tokens.

Plain Python (`random`), never torch: one step's sampling must cost what choosing a
few hundred ints costs, or it would be measured as the worker's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from worker_svc.sampler import SamplingRow, TokenLogprobs, seed_for_token

# The top logprobs' mass halves from one rank to the next: a plausible, peaked
# distribution (each value <= 0, descending, total probability below one).
_LN2 = math.log(2.0)


def ordinary_token_ids(tokenizer) -> tuple[int, ...]:
    """The ids of tokens that decode, alone, to printable text: no special tokens,
    no byte pieces of a longer character (they decode to U+FFFD), no pure whitespace."""
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])
    ids = [
        token_id
        for token_id, text in enumerate(texts)
        if token_id not in special and text.strip() and text.isprintable() and "\ufffd" not in text
    ]
    if not ids:
        raise ValueError("the tokenizer has no ordinary text tokens to sample from")
    return tuple(ids)


@dataclass(frozen=True)
class NullVocabulary:
    """What the null sampler draws from."""

    token_ids: tuple[int, ...]
    eos_token_id: int | None
    eos_probability: float = 0.0

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("token_ids must not be empty")
        if not 0 <= self.eos_probability <= 1:
            raise ValueError(f"eos_probability must be in [0, 1], got {self.eos_probability}")
        if self.eos_probability and self.eos_token_id is None:
            raise ValueError("an eos_probability needs an eos_token_id")


class NullSampler:
    """Draws one token per row. Seeded rows draw from (seed, output index) alone, as the
    real sampler's do, so a recomputed request gets the same tokens again."""

    def __init__(self, vocabulary: NullVocabulary, seed: int = 0) -> None:
        self.vocabulary = vocabulary
        self._rng = random.Random(seed)

    def sample(self, rows: Sequence[SamplingRow]) -> list[int]:
        return [self._one(row) for row in rows]

    def _one(self, row: SamplingRow) -> int:
        sampling = row.sampling
        if sampling.seed is None:
            rng = self._rng
        else:
            rng = random.Random(seed_for_token(sampling.seed, row.num_output_tokens))
        vocabulary = self.vocabulary
        if (
            vocabulary.eos_probability
            and row.num_output_tokens >= sampling.min_tokens
            and rng.random() < vocabulary.eos_probability
        ):
            return vocabulary.eos_token_id
        return rng.choice(vocabulary.token_ids)

    def index_below(self, n: int) -> int:
        """A uniform index in [0, n), from the sampler's own generator."""
        return self._rng.randrange(n)

    def logprobs(self, token_id: int, num_logprobs: int) -> TokenLogprobs:
        """The sampled token as the most likely one, then others of halving probability."""
        top_ids = [token_id]
        pool = self.vocabulary.token_ids
        wanted = min(num_logprobs, len(pool))
        while len(top_ids) < wanted:
            candidate = self._rng.choice(pool)
            if candidate not in top_ids:
                top_ids.append(candidate)
        top_logprobs = [-(rank + 1) * _LN2 for rank in range(len(top_ids))]
        return TokenLogprobs(
            logprob=top_logprobs[0], top_token_ids=top_ids, top_logprobs=top_logprobs
        )
