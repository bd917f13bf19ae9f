"""The CPU backend: the torch backend, with decodes attended by the C kernel.

Decodes dominate a serving step, and with the torch path their cost grows with
the padded, gathered copy of every decode's keys (see torch_backend). The
kernel (kernels/paged_decode.c) reads each sequence's blocks where they lie and
only up to its own length, so a batch of chat-length contexts costs what its
tokens cost. Prefill chunks keep the torch path: a chunk's many queries make
SDPA's kernels efficient, and its gather is paid once for all of them. (Where a native
decode step runs the model, prompts come as decode rows instead: step/flat_batch.py.)

The kernel reads float32 pools and float16 ones (--kv-cache-dtype float16, half the
bytes a decode reads); a bfloat16 pool keeps the torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker_svc.attention.base import BatchLayout
from worker_svc.attention.cpu_kernel import CACHE_DTYPES, paged_decode_attention
from worker_svc.attention.torch_backend import TorchAttentionBackend, decode_token_positions


def kernel_cache_unsupported_reason(kv_dtype: torch.dtype) -> str | None:
    """None when the kernel reads a pool of this dtype (--kv-cache-dtype), else why not."""
    if kv_dtype not in CACHE_DTYPES:
        return f"the CPU kernel reads float32 or float16 KV caches, not {kv_dtype}"
    return None


@dataclass(frozen=True)
class KernelDecodes:
    # Where the decode tokens sit in the flat batch (see DecodeBatch.tokens).
    tokens: slice | torch.Tensor
    block_tables: torch.Tensor  # [D, max_blocks] int32, padded with block 0
    context_lens: torch.Tensor  # [D] int32


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"

    def decode_metadata(
        self, layout: BatchLayout, decodes: list[int], device: torch.device
    ) -> tuple[KernelDecodes, ...]:
        tokens = decode_token_positions(layout, decodes, device)
        lens = [layout.context_lens[i] for i in decodes]
        max_blocks = -(-max(lens) // layout.block_size)
        tables = [list(layout.block_tables[i][:max_blocks]) for i in decodes]
        padded = [table + [0] * (max_blocks - len(table)) for table in tables]
        return (
            KernelDecodes(
                tokens=tokens,
                block_tables=torch.tensor(padded, dtype=torch.int32),
                context_lens=torch.tensor(lens, dtype=torch.int32),
            ),
        )

    def attend_decodes(
        self,
        queries: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        dec: KernelDecodes,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return paged_decode_attention(
            queries, k_cache, v_cache, dec.block_tables, dec.context_lens, scale, window, sinks
        )
