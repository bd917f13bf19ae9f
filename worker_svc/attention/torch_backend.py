"""Paged attention in plain torch: the reference backend, and the one used on CPU.

Per layer: K/V of the step's tokens are written into their pool slots, then
- decodes (query length 1) attend in groups of similar context length: one
  padded gather of a group's blocks and one SDPA call with a length mask.
  One group for all would pad every sequence to the longest one, and with
  chat-length spreads (a 1,500-token context beside 200-token ones) most of
  the gathered keys would be padding;
- each prefill chunk attends on its own: a chunk with no earlier context uses
  the fresh K/V with `is_causal`; a chunk starting at position p gathers its
  blocks and uses a bottom-right causal mask (query i sees keys 0..p+i),
  because SDPA's own `is_causal` is top-left aligned when q != k.

Gathers go by whole blocks (`index_select` on the block dimension): on CPU that
is about 3x faster than gathering single slots, and the mask hides the tail.
A pool of another dtype than the model's (--kv-cache-dtype) is written rounded to
it and read back in the query's dtype. A layer with attention sinks (gpt-oss) attends
explicitly instead of through SDPA (attention/sinks.py says why).
The runner packs decodes first, longest context first, so that each group's
queries and outputs are one slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from worker_svc.attention.base import AttentionBackend, BatchLayout, PagedAttentionContext
from worker_svc.attention.sinks import attend_chunk_with_sinks, attend_with_sinks
from worker_svc.kv_pool import KVPool, KVPoolSpec

SCRATCH_BLOCK_SIZE = 16


@dataclass(frozen=True)
class PrefillSegment:
    start: int
    length: int
    # None when the chunk is the whole context so far: attend to the fresh K/V.
    block_ids: torch.Tensor | None
    mask: torch.Tensor | None  # [length, blocks * block_size]
    first_position: int = 0  # the chunk's first query position (its context offset)

    def windowed_mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """Causal and within the sliding window: query i sees keys i - window + 1 .. i
        (all of 0 .. i without a window)."""
        keys = self.mask.shape[1] if self.mask is not None else self.length
        key_pos = torch.arange(keys, device=device)
        query_pos = torch.arange(self.first_position, self.first_position + self.length)
        delta = query_pos.to(device)[:, None] - key_pos[None, :]
        return (delta >= 0) & (delta < window) if window is not None else delta >= 0


@dataclass(frozen=True)
class DecodeBatch:
    # Where the group's decode tokens sit in the flat batch: a slice when they
    # are adjacent (the runner's order), else an index tensor.
    tokens: slice | torch.Tensor
    block_ids: torch.Tensor  # [D * max_blocks], padded with block 0
    mask: torch.Tensor  # [D, 1, 1, max_blocks * block_size], True where the key is real
    context_lens: torch.Tensor | None = None  # [D], for a sliding window's masks

    def windowed_mask(self, window: int) -> torch.Tensor:
        """The mask, also hiding keys more than `window` - 1 before each query."""
        key_pos = torch.arange(self.mask.shape[-1], device=self.mask.device)
        recent = key_pos[None, :] >= (self.context_lens - window)[:, None]
        return self.mask & recent[:, None, None, :]


@dataclass(frozen=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T]
    decodes: tuple[Any, ...]  # DecodeBatch here; a subclass may keep its own kind
    prefills: tuple[PrefillSegment, ...]


# A decode group closes when the next context needs at most this share of the
# group's longest context (so at most about a quarter of a group is padding),
# but only once it has MIN_DECODE_GROUP members: each group costs two gathers
# and one SDPA call per layer, which a handful of sequences does not repay.
DECODE_GROUP_FILL = 0.75
MIN_DECODE_GROUP = 8


def decode_token_positions(
    layout: BatchLayout, decodes: list[int], device: torch.device
) -> slice | torch.Tensor:
    """Where the given decodes' tokens sit in the flat batch: a slice when adjacent."""
    all_starts = layout.query_starts
    starts = [all_starts[i] for i in decodes]
    if starts == list(range(starts[0], starts[0] + len(starts))):
        return slice(starts[0], starts[0] + len(starts))
    return torch.tensor(starts, device=device)


def group_decodes(context_lens: dict[int, int], block_size: int) -> list[list[int]]:
    """Batch indices of the decodes, longest context first, cut into groups of similar
    length in blocks (see DECODE_GROUP_FILL)."""
    order = sorted(context_lens, key=lambda i: -context_lens[i])
    groups: list[list[int]] = []
    group_blocks = 0
    for i in order:
        blocks = -(-context_lens[i] // block_size)
        if groups and (
            len(groups[-1]) < MIN_DECODE_GROUP or blocks > group_blocks * DECODE_GROUP_FILL
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
            group_blocks = blocks
    return groups


def _gather_blocks(
    cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """`[num_blocks, bs, kv_heads, d]` -> the given blocks' slots `[n * bs, kv_heads, d]`,
    in the query's dtype (SDPA takes q, k and v in one)."""
    return cache.index_select(0, block_ids).flatten(0, 1).to(dtype)


def as_stored(fresh: torch.Tensor, pool_dtype: torch.dtype) -> torch.Tensor:
    """Fresh K/V as a later read of the pool returns them: rounded to the pool's dtype.

    A prefill chunk with no earlier context attends to its own K/V without reading the
    pool; rounding them as the pool stores them keeps its logits independent of how a
    prompt was chunked or what prefix was cached (a float16 pool otherwise gives the
    first chunk exact K/V and the later ones rounded K/V)."""
    if pool_dtype in (fresh.dtype, torch.float32):  # float32 holds 16-bit values exactly
        return fresh
    return fresh.to(pool_dtype).to(fresh.dtype)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    supports_sinks = True

    def build_metadata(self, layout: BatchLayout, device: torch.device) -> TorchAttentionMetadata:
        bs = layout.block_size
        decodes: list[int] = []
        prefills: list[PrefillSegment] = []
        for i, (start, q, c) in enumerate(
            zip(layout.query_starts, layout.query_lens, layout.context_lens, strict=True)
        ):
            if q == 1:
                decodes.append(i)
                continue
            if c == q:
                prefills.append(PrefillSegment(start, q, None, None))
                continue
            num_blocks = -(-c // bs)
            block_ids = layout.block_tables[i][:num_blocks]
            key_pos = torch.arange(num_blocks * bs, device=device)
            query_pos = torch.arange(c - q, c, device=device)
            mask = key_pos[None, :] <= query_pos[:, None]
            prefills.append(
                PrefillSegment(start, q, torch.tensor(block_ids, device=device), mask, c - q)
            )
        return TorchAttentionMetadata(
            slot_mapping=layout.slot_mapping(device),
            decodes=self.decode_metadata(layout, decodes, device) if decodes else (),
            prefills=tuple(prefills),
        )

    def decode_metadata(
        self, layout: BatchLayout, decodes: list[int], device: torch.device
    ) -> tuple[DecodeBatch, ...]:
        """What `attend_decodes` needs for the decodes (batch indices `decodes`)."""
        groups = group_decodes({i: layout.context_lens[i] for i in decodes}, layout.block_size)
        return tuple(self._decode_batch(layout, group, device) for group in groups)

    @staticmethod
    def _decode_batch(layout: BatchLayout, decodes: list[int], device: torch.device) -> DecodeBatch:
        bs = layout.block_size
        tokens = decode_token_positions(layout, decodes, device)
        lens = torch.tensor([layout.context_lens[i] for i in decodes], device=device)
        max_blocks = -(-int(lens.max()) // bs)
        # Padding points at block 0: real memory whose values the mask hides.
        table = torch.zeros((len(decodes), max_blocks), dtype=torch.long)
        for row, i in enumerate(decodes):
            blocks = layout.block_tables[i][:max_blocks]
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        key_pos = torch.arange(max_blocks * bs, device=device)
        return DecodeBatch(
            tokens=tokens,
            block_ids=table.flatten().to(device),
            mask=(key_pos[None, :] < lens[:, None])[:, None, None, :],
            context_lens=lens,
        )

    def forward(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        pool: KVPool,
        metadata: TorchAttentionMetadata,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        k_cache, v_cache = pool.layer(layer_idx)
        k_slots, v_slots = pool.layer_slots(layer_idx)
        # A pool of another dtype (--kv-cache-dtype) stores K/V rounded to it.
        k_slots.index_copy_(0, metadata.slot_mapping, key.to(pool.dtype))
        v_slots.index_copy_(0, metadata.slot_mapping, value.to(pool.dtype))

        out = query.new_empty((num_tokens, num_heads, head_dim))
        for dec in metadata.decodes:
            out[dec.tokens] = self.attend_decodes(
                query[dec.tokens], k_cache, v_cache, dec, scale, window, sinks
            )
        for seg in metadata.prefills:
            chunk = slice(seg.start, seg.start + seg.length)
            # A window shorter than the chunk's context hides its oldest keys.
            windowed = window is not None and seg.first_position + seg.length > window
            if seg.block_ids is None:
                k = as_stored(key[chunk], pool.dtype)
                v = as_stored(value[chunk], pool.dtype)
            else:
                k = _gather_blocks(k_cache, seg.block_ids, query.dtype)
                v = _gather_blocks(v_cache, seg.block_ids, query.dtype)
            if sinks is not None:
                mask = seg.windowed_mask(window if windowed else None, query.device)
                out[chunk] = attend_chunk_with_sinks(query[chunk], k, v, mask, scale, sinks)
                continue
            # seg.mask is None for a chunk from position 0: is_causal.
            mask = seg.windowed_mask(window, query.device) if windowed else seg.mask
            # SDPA wants [1, heads, T, d]: a transpose per prefill chunk, none per decode.
            o = F.scaled_dot_product_attention(
                query[chunk].transpose(0, 1).unsqueeze(0),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=True,
            )
            out[chunk] = o[0].transpose(0, 1)
        return out

    def attend_decodes(
        self,
        queries: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        dec: DecodeBatch,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decode group: queries `[D, heads, d]` -> `[D, heads, d]`."""
        d, num_heads, head_dim = queries.shape
        num_kv_heads = k_cache.shape[2]
        # GQA without copying K/V per query head: the query heads sharing a
        # KV head become that head's "query positions" (a decode has no
        # causal structure among them), so K/V keep their kv_heads.
        q = queries.reshape(d, num_kv_heads, -1, head_dim)
        k = _gather_blocks(k_cache, dec.block_ids, q.dtype).view(d, -1, num_kv_heads, head_dim)
        v = _gather_blocks(v_cache, dec.block_ids, q.dtype).view(d, -1, num_kv_heads, head_dim)
        mask = dec.windowed_mask(window) if window is not None else dec.mask
        if sinks is not None:
            o = attend_with_sinks(
                q.unsqueeze(3),
                k.transpose(1, 2),
                v.transpose(1, 2),
                mask.unsqueeze(3),
                scale,
                sinks,
            )
            return o.reshape(d, num_heads, head_dim)
        o = F.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
        )
        return o.reshape(d, num_heads, head_dim)


def scratch_context(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    query_lens: tuple[int, ...],
    device: torch.device | str = "cpu",
) -> PagedAttentionContext:
    """The torch backend over a throwaway pool, for a forward whose K/V nobody keeps
    (compiling the graphs, calibrating int8): each sequence is a prefill from position 0
    in blocks of its own."""
    spec = KVPoolSpec(num_layers, num_kv_heads, head_dim, SCRATCH_BLOCK_SIZE, dtype)
    tables, next_block = [], 0
    for query_len in query_lens:
        blocks = spec.blocks_for_tokens(query_len)
        tables.append(tuple(range(next_block, next_block + blocks)))
        next_block += blocks
    layout = BatchLayout(query_lens, query_lens, tuple(tables), SCRATCH_BLOCK_SIZE)
    backend = TorchAttentionBackend()
    device = torch.device(device)
    pool = KVPool(spec, next_block, device)
    return PagedAttentionContext(backend, pool, backend.build_metadata(layout, device))
