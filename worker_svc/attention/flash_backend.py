"""Paged attention with upstream flash-attn 2 on CUDA (`flash_attn_varlen_func` + `block_table`).

Not testable on the CPU development machines; kept small on purpose. The
whole flat batch (prefill chunks and decodes together) is one kernel call per
layer: flash-attn's causal mask is bottom-right aligned, which is exactly
"query i of a chunk starting at p sees keys 0..p+i".

Constraints of upstream flash-attn 2.x, checked at start-up by
`flash_attn_unsupported_reason` so that the worker fails before serving:
- a CUDA device of compute capability 8.0 or newer (Ampere+);
- float16 or bfloat16 (no float32 kernels), the KV cache in the same dtype as the
  model (--kv-cache-dtype auto, or the model's own);
- paged KV needs a block size divisible by 256 (`flash_api.cpp`:
  "Paged KV cache block size must be divisible by 256"); the scheduler's default
  of 16 therefore selects the torch backend unless the block size is raised;
- head_dim a multiple of 8 and at most 256;
- a flash-attn version whose `flash_attn_varlen_func` accepts `block_table` (2.6+);
- no attention sinks (gpt-oss): `supports_sinks` is False, and `select_backend` skips
  flash-attn for a model that has them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from itertools import accumulate

import torch

from worker_svc.attention.base import AttentionBackend, BatchLayout
from worker_svc.kv_pool import KVPool

FLASH_BLOCK_SIZE_MULTIPLE = 256


def flash_attn_unsupported_reason(
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
) -> str | None:
    """Why flash-attn cannot serve this configuration, or None when it can."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:
        return f"flash_attn is not importable ({exc})"
    if device.type != "cuda":
        return f"flash_attn needs a CUDA device, got {device}"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "flash_attn needs compute capability 8.0 or newer"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash_attn needs float16 or bfloat16, got {dtype}"
    if kv_dtype is not None and kv_dtype != dtype:
        # Its kernels take the cache in the query's dtype: no conversion on the read.
        return f"flash_attn needs the KV cache in the model's dtype {dtype}, got {kv_dtype}"
    if block_size % FLASH_BLOCK_SIZE_MULTIPLE:
        return (
            f"flash_attn's paged KV needs a block size divisible by "
            f"{FLASH_BLOCK_SIZE_MULTIPLE}, got {block_size}"
        )
    if head_dim % 8 or head_dim > 256:
        return f"flash_attn needs head_dim a multiple of 8 and <= 256, got {head_dim}"
    if "block_table" not in inspect.signature(flash_attn_varlen_func).parameters:
        return "this flash_attn version has no block_table in flash_attn_varlen_func (need 2.6+)"
    return None


@dataclass(frozen=True)
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    cu_seqlens_q: torch.Tensor  # [N + 1] int32
    cu_seqlens_k: torch.Tensor  # [N + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # [N, max_blocks] int32, padded with 0


class FlashAttentionBackend(AttentionBackend):
    name = "flash_attn"
    # flash_attn_varlen_func (2.x) has no sink logits: a gpt-oss layer would lose them.
    supports_sinks = False

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def build_metadata(self, layout: BatchLayout, device: torch.device) -> FlashAttentionMetadata:
        max_blocks = max(len(t) for t in layout.block_tables)
        table = torch.zeros((len(layout.block_tables), max_blocks), dtype=torch.int32)
        for row, blocks in enumerate(layout.block_tables):
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)

        def cumulative(lengths: tuple[int, ...]) -> torch.Tensor:
            return torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=device)

        return FlashAttentionMetadata(
            slot_mapping=layout.slot_mapping(device),
            cu_seqlens_q=cumulative(layout.query_lens),
            cu_seqlens_k=cumulative(layout.context_lens),
            max_seqlen_q=max(layout.query_lens),
            max_seqlen_k=max(layout.context_lens),
            block_table=table.to(device, non_blocking=True),
        )

    def forward(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        pool: KVPool,
        metadata: FlashAttentionMetadata,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if sinks is not None:
            raise NotImplementedError(
                "flash_attn has no attention sinks (gpt-oss): use the torch backend"
            )
        k_slots, v_slots = pool.layer_slots(layer_idx)
        k_slots.index_copy_(0, metadata.slot_mapping, key)
        v_slots.index_copy_(0, metadata.slot_mapping, value)
        k_cache, v_cache = pool.layer(layer_idx)
        out = self._varlen(
            query.contiguous(),
            k_cache,
            v_cache,
            metadata.cu_seqlens_q,
            metadata.cu_seqlens_k,
            metadata.max_seqlen_q,
            metadata.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            # flash-attn's window counts keys left of the query, the query not included.
            window_size=(window - 1, 0) if window is not None else (-1, -1),
            block_table=metadata.block_table,
        )
        return out
