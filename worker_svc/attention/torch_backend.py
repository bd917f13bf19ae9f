"""Paged attention in plain torch: the reference backend, and the one used on CPU.

Per layer: K/V of the step's tokens are written into their pool slots, then
- all decodes (query length 1) attend together: one padded gather of their
  blocks and one SDPA call with a length mask;
- each prefill chunk attends on its own: a chunk with no earlier context uses
  the fresh K/V with `is_causal`; a chunk starting at position p gathers its
  blocks and uses a bottom-right causal mask (query i sees keys 0..p+i),
  because SDPA's own `is_causal` is top-left aligned when q != k.

Gathers go by whole blocks (`index_select` on the block dimension): on CPU that
is about 3x faster than gathering single slots, and the mask hides the tail.
The runner packs decodes first, so their queries and outputs are one slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worker_svc.attention.base import AttentionBackend, BatchLayout
from worker_svc.kv_pool import KVPool


@dataclass(frozen=True)
class PrefillSegment:
    start: int
    length: int
    # None when the chunk is the whole context so far: attend to the fresh K/V.
    block_ids: torch.Tensor | None
    mask: torch.Tensor | None  # [length, blocks * block_size]


@dataclass(frozen=True)
class DecodeBatch:
    # Where the decode tokens sit in the flat batch: a slice when they come
    # first (the runner's order), else an index tensor.
    tokens: slice | torch.Tensor
    block_ids: torch.Tensor  # [D * max_blocks], padded with block 0
    mask: torch.Tensor  # [D, 1, 1, max_blocks * block_size], True where the key is real


@dataclass(frozen=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T]
    decodes: DecodeBatch | None
    prefills: tuple[PrefillSegment, ...]


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """`[num_blocks, bs, kv_heads, d]` -> the given blocks' slots `[n * bs, kv_heads, d]`."""
    return cache.index_select(0, block_ids).flatten(0, 1)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

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
            prefills.append(PrefillSegment(start, q, torch.tensor(block_ids, device=device), mask))
        return TorchAttentionMetadata(
            slot_mapping=layout.slot_mapping(device),
            decodes=self._decode_batch(layout, decodes, device) if decodes else None,
            prefills=tuple(prefills),
        )

    @staticmethod
    def _decode_batch(layout: BatchLayout, decodes: list[int], device: torch.device) -> DecodeBatch:
        bs = layout.block_size
        starts = layout.query_starts
        if decodes == list(range(len(decodes))):
            tokens: slice | torch.Tensor = slice(0, len(decodes))
        else:
            tokens = torch.tensor([starts[i] for i in decodes], device=device)
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
    ) -> torch.Tensor:
        _, num_heads, num_tokens, head_dim = query.shape
        num_kv_heads = key.shape[1]
        k_cache, v_cache = pool.layer(layer_idx)
        k_slots, v_slots = pool.layer_slots(layer_idx)
        k_slots.index_copy_(0, metadata.slot_mapping, key[0].transpose(0, 1))
        v_slots.index_copy_(0, metadata.slot_mapping, value[0].transpose(0, 1))

        out = query.new_empty((num_tokens, num_heads, head_dim))
        if metadata.decodes is not None:
            dec = metadata.decodes
            q = query[0].transpose(0, 1)[dec.tokens]
            d = q.shape[0]
            # GQA without copying K/V per query head: the query heads sharing a
            # KV head become that head's "query positions" (a decode has no
            # causal structure among them), so K/V keep their kv_heads.
            q = q.reshape(d, num_kv_heads, -1, head_dim)
            k = _gather_blocks(k_cache, dec.block_ids).view(d, -1, num_kv_heads, head_dim)
            v = _gather_blocks(v_cache, dec.block_ids).view(d, -1, num_kv_heads, head_dim)
            o = F.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=dec.mask, scale=scale
            )
            out[dec.tokens] = o.reshape(d, num_heads, head_dim)
        for seg in metadata.prefills:
            q = query[:, :, seg.start : seg.start + seg.length]
            if seg.block_ids is None:
                k = key[:, :, seg.start : seg.start + seg.length]
                v = value[:, :, seg.start : seg.start + seg.length]
                o = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=scale, enable_gqa=True
                )
            else:
                k = _gather_blocks(k_cache, seg.block_ids).transpose(0, 1).unsqueeze(0)
                v = _gather_blocks(v_cache, seg.block_ids).transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=seg.mask, scale=scale, enable_gqa=True
                )
            out[seg.start : seg.start + seg.length] = o[0].transpose(0, 1)
        return out.unsqueeze(0)
