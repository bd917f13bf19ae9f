"""What the worker keeps about one sequence between steps of a stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.ngram import NgramIndex
from common.sampling_params import SamplingParams
from worker_svc.sampler import PenaltyCounts


@dataclass
class SequenceState:
    """Tokens = prompt + outputs; the first `num_computed_tokens` have KV in `block_ids`.

    After a sample, the new token is appended but not yet computed: the next
    decode step computes it (the plan carries no token id).
    """

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    block_ids: list[int]
    sampling: SamplingParams
    penalties: PenaltyCounts | None = field(default=None, repr=False)
    # Score the prompt positions this sequence computes, with this many alternatives
    # (NewSequence.prompt_logprobs); None: no.
    prompt_logprobs: int | None = None
    # Its n-grams, built at its first drafting step (common/ngram.py).
    ngram: NgramIndex | None = field(default=None, repr=False)
    # The LoRA slot all its tokens are computed with (NewSequence.adapter_slot); 0: base.
    adapter_slot: int = 0

    @classmethod
    def create(
        cls,
        seq_id: int,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        num_computed_tokens: int,
        block_ids: list[int],
        sampling: SamplingParams,
        vocab_size: int,
        prompt_logprobs: int | None = None,
        adapter_slot: int = 0,
    ) -> SequenceState:
        penalties = None
        if sampling.uses_penalties:
            penalties = PenaltyCounts(vocab_size, prompt_token_ids, output_token_ids)
        return cls(
            seq_id=seq_id,
            token_ids=prompt_token_ids + output_token_ids,
            num_prompt_tokens=len(prompt_token_ids),
            num_computed_tokens=num_computed_tokens,
            block_ids=block_ids,
            sampling=sampling,
            penalties=penalties,
            prompt_logprobs=prompt_logprobs,
            adapter_slot=adapter_slot,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        # Outputs generated before a recompute count: penalties and seeded
        # sampling continue where they were.
        return len(self.token_ids) - self.num_prompt_tokens

    def propose_drafts(self, k: int, min_n: int, max_n: int) -> list[int]:
        """Up to k drafts to follow its tokens, from its own earlier n-grams."""
        if self.ngram is None or (self.ngram.min_n, self.ngram.max_n) != (min_n, max_n):
            self.ngram = NgramIndex(min_n, max_n)
        return self.ngram.propose(self.token_ids, k)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.penalties is not None:
            self.penalties.append(token_id)
