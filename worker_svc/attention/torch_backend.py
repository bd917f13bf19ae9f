"""Paged attention in plain torch: the reference backend, and the one used on CPU.

Per layer: K/V of the step's tokens are written into their pool slots, then
- all decodes (query length 1) attend together: one padded gather of their
  context slots and one SDPA call with a length mask;
- each prefill chunk attends on its own: a chunk with no earlier context uses
  the fresh K/V with `is_causal`; a chunk starting at position p gathers its
  p + q keys and uses a bottom-right causal mask (query i sees keys 0..p+i),
  because SDPA's own `is_causal` is top-left aligned when q != k.
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
    key_slots: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass(frozen=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T]
    decode_token_idx: torch.Tensor | None  # [D] positions in the flat batch
    decode_key_slots: torch.Tensor | None  # [D, L] pool slots, padded
    decode_mask: torch.Tensor | None  # [D, 1, 1, L] True where the key is real
    prefills: tuple[PrefillSegment, ...]


def _slots_for_positions(
    block_table: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    return block_table[..., positions // block_size] * block_size + positions % block_size


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
            table = torch.tensor(layout.block_tables[i], dtype=torch.long, device=device)
            key_pos = torch.arange(c, device=device)
            query_pos = torch.arange(c - q, c, device=device)
            mask = key_pos[None, :] <= query_pos[:, None]
            prefills.append(
                PrefillSegment(start, q, _slots_for_positions(table, key_pos, bs), mask)
            )

        decode_idx = decode_slots = decode_mask = None
        if decodes:
            starts = layout.query_starts
            decode_idx = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
            lens = torch.tensor([layout.context_lens[i] for i in decodes], device=device)
            max_len = int(lens.max())
            max_blocks = -(-max_len // bs)
            # Padding points at block 0: a valid slot whose value the mask hides.
            tables = torch.zeros((len(decodes), max_blocks), dtype=torch.long, device=device)
            for row, i in enumerate(decodes):
                table = layout.block_tables[i][:max_blocks]
                tables[row, : len(table)] = torch.tensor(table, dtype=torch.long)
            key_pos = torch.arange(max_len, device=device)
            decode_slots = _slots_for_positions(tables, key_pos, bs)
            decode_mask = (key_pos[None, :] < lens[:, None])[:, None, None, :]
        return TorchAttentionMetadata(
            slot_mapping=layout.slot_mapping(device),
            decode_token_idx=decode_idx,
            decode_key_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=tuple(prefills),
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
        k_slots, v_slots = pool.layer_slots(layer_idx)
        k_slots.index_copy_(0, metadata.slot_mapping, key[0].transpose(0, 1))
        v_slots.index_copy_(0, metadata.slot_mapping, value[0].transpose(0, 1))

        out = query.new_empty((num_tokens, num_heads, head_dim))
        if metadata.decode_token_idx is not None:
            idx = metadata.decode_token_idx
            d = idx.numel()
            # GQA without copying K/V per query head: the query heads sharing a
            # KV head become that head's "query positions" (a decode has no
            # causal structure among them), so K/V keep their kv_heads.
            q = query[0].transpose(0, 1)[idx].view(d, num_kv_heads, -1, head_dim)
            k = k_slots[metadata.decode_key_slots].transpose(1, 2)
            v = v_slots[metadata.decode_key_slots].transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=metadata.decode_mask, scale=scale)
            out[idx] = o.reshape(d, num_heads, head_dim)
        for seg in metadata.prefills:
            q = query[:, :, seg.start : seg.start + seg.length]
            if seg.key_slots is None:
                k = key[:, :, seg.start : seg.start + seg.length]
                v = value[:, :, seg.start : seg.start + seg.length]
                o = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=scale, enable_gqa=True
                )
            else:
                k = k_slots[seg.key_slots].transpose(0, 1).unsqueeze(0)
                v = v_slots[seg.key_slots].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=seg.mask, scale=scale, enable_gqa=True
                )
            out[seg.start : seg.start + seg.length] = o[0].transpose(0, 1)
        return out.unsqueeze(0)
