"""A step plan as plain values: what the runners consume instead of the wire's StepPlan.

The reader (reader.py) builds one per plan, after every check has passed, so that
nothing downstream walks protobuf fields again or meets a value the worker cannot
serve. Like the wire, the plan is a diff (vLLM's SchedulerOutput): new sequences
carry all their tokens, continuing ones only their new blocks and a token count,
finished ids say what to drop.

Plain decodes (one token, no new block; most of any busy step) stay a tuple of ids,
as the wire packs them (decode_seq_ids): an object per decode would cost more Python
at batch 64 than the rest of reading the plan. Anything a decode must carry beyond
its id (a speculative draft, say) makes it a ContinuingSequence instead.

Fields are added with defaults, so that a reader and a runner that know nothing of
a new one go on working: where a plan may carry more (a deferred mask, draft tokens),
it is a field here, read in reader.py and used where it matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from worker_svc.token_bitmask import DraftRows

# The masks of a step that has none: one shared, read-only, empty mapping.
NO_MASKS: Mapping[int, np.ndarray] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NewSequence:
    """A sequence the worker does not hold: its prompt and, when it is recomputed, the
    outputs it already has; the first num_computed_tokens already have KV (a prefix
    cache hit), the next num_scheduled_tokens are computed now."""

    seq_id: int
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    num_computed_tokens: int
    num_scheduled_tokens: int
    block_ids: tuple[int, ...]
    sampling: SamplingParams
    # Score the prompt positions it computes, with this many alternatives; None: no.
    prompt_logprobs: int | None = None
    # The LoRA slot it is computed with for its whole life (worker_svc/lora); 0: base.
    adapter_slot: int = 0


@dataclass(frozen=True, slots=True)
class ContinuingSequence:
    """A held sequence that needs more than a plain decode: a next prefill chunk, or a
    decode whose KV runs into new blocks."""

    seq_id: int
    num_scheduled_tokens: int
    new_block_ids: tuple[int, ...] = ()
    # A decode that may verify up to this many drafts of its own (speculation/).
    num_draft_tokens: int = 0


@dataclass(frozen=True, slots=True)
class NgramLookup:
    """How the worker proposes drafts (common/ngram.py): suffixes of min_n..max_n."""

    min_n: int
    max_n: int


@dataclass(frozen=True, slots=True)
class Step:
    step_id: int
    # Forwards back to back (multi-step decoding, decodes only); 1 for most plans.
    num_steps: int = 1
    finished_seq_ids: tuple[int, ...] = ()
    new_sequences: tuple[NewSequence, ...] = ()
    continuing_sequences: tuple[ContinuingSequence, ...] = ()
    # Held sequences that compute one token (the one they sampled) in the blocks they have.
    decode_seq_ids: tuple[int, ...] = ()
    # seq_id -> its allowed-token row (token_bitmask.py), for constrained rows; one-step
    # plans only: the next row needs this step's token.
    allowed_tokens: Mapping[int, np.ndarray] = field(default_factory=dict)
    # seq_id -> all its rows, for a constrained sequence whose mask follows its drafts
    # (one row per position it may emit: token_bitmask.DraftRows).
    allowed_draft_rows: Mapping[int, DraftRows] = field(default_factory=lambda: NO_MASKS)
    # Constrained rows whose mask follows in a message of its own (deferred_masks.py);
    # the sampler waits for it up to deferred_mask_timeout_s (0: the worker's default).
    deferred_mask_seq_ids: frozenset[int] = frozenset()
    deferred_mask_timeout_s: float = 0.0
    # Set where a continuing sequence has num_draft_tokens.
    ngram_lookup: NgramLookup | None = None
