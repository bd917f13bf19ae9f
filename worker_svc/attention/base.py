"""What every attention backend receives: the layout of one step's flat batch.

The runner describes the step once (which tokens belong to which sequence, how
long each sequence's context is, which blocks hold it); each backend turns
that into its own tensors once per step in `build_metadata`, and every layer's
`forward` reuses them. Nothing here is recomputed per layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from worker_svc.kv_pool import KVPool


@dataclass(frozen=True)
class BatchLayout:
    """One step's flat batch: sequence i owns the next `query_lens[i]` tokens.

    A sequence's query tokens are its positions
    `context_lens[i] - query_lens[i] .. context_lens[i] - 1`, so a prefill chunk
    starting at offset p has `context_lens = p + query_len`, and a decode has
    `query_len == 1`.
    """

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    block_size: int

    def __post_init__(self) -> None:
        n = len(self.query_lens)
        if len(self.context_lens) != n or len(self.block_tables) != n:
            raise ValueError("query_lens, context_lens and block_tables must have equal lengths")
        for q, c, table in zip(self.query_lens, self.context_lens, self.block_tables, strict=True):
            if q <= 0 or c < q:
                raise ValueError(f"bad lengths: query_len={q} context_len={c}")
            if len(table) * self.block_size < c:
                raise ValueError(f"{len(table)} blocks cannot hold {c} tokens")

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def query_starts(self) -> list[int]:
        starts, total = [], 0
        for q in self.query_lens:
            starts.append(total)
            total += q
        return starts

    def slot_mapping(self, device: torch.device | str) -> torch.Tensor:
        """Pool slot of every token of the flat batch, where its K/V is written."""
        slots: list[int] = []
        bs = self.block_size
        for q, c, table in zip(self.query_lens, self.context_lens, self.block_tables, strict=True):
            slots.extend(table[p // bs] * bs + p % bs for p in range(c - q, c))
        return torch.tensor(slots, dtype=torch.long, device=device)


class AttentionBackend(ABC):
    """Paged attention for one flat batch: write K/V into the pool, attend over the blocks."""

    name: ClassVar[str]
    # Whether `forward` takes per-head attention sinks (gpt-oss); a backend without
    # them raises on a call with sinks, and the loader refuses such a model up front.
    supports_sinks: ClassVar[bool] = False

    @abstractmethod
    def build_metadata(self, layout: BatchLayout, device: torch.device) -> Any:
        """Everything `forward` needs about the batch, computed once per step."""

    @abstractmethod
    def forward(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        pool: KVPool,
        metadata: Any,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query `[T, heads, d]`, key/value `[T, kv_heads, d]` -> `[T, heads, d]`.
        With a sliding `window` (a layer's of Gemma 3 or Mistral), a query at position p
        sees keys p - window + 1 .. p only, as transformers masks it.
        With `sinks` (`[heads]`, float32; gpt-oss), each head's softmax also counts one
        learned logit that takes weight but no value (see attention/sinks.py).

        The flat token-major layout of the own forward: its projections produce it
        with a view, so no layer pays a transpose to call attention.
        """


@dataclass(frozen=True)
class PagedAttentionContext:
    """Handed to the model call as a keyword; transformers passes it to every layer."""

    backend: AttentionBackend
    pool: KVPool
    metadata: Any
    # The step's rows by LoRA adapter (worker_svc/lora/batch.LoraBatch); None: the
    # base for every row (a worker without --enable-lora). The own forward's layers
    # read it here, as they read the attention state: it is per step, like it.
    lora: Any = None
