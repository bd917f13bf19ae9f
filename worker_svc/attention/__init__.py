"""Attention backends behind one interface, and the choice between them."""

from __future__ import annotations

import torch

from worker_svc.attention.base import AttentionBackend, BatchLayout, PagedAttentionContext
from worker_svc.attention.flash_backend import flash_attn_unsupported_reason
from worker_svc.attention.torch_backend import TorchAttentionBackend
from worker_svc.attention.transformers_hook import (
    ATTN_IMPLEMENTATION,
    CONTEXT_KWARG,
    register_with_transformers,
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "CONTEXT_KWARG",
    "AttentionBackend",
    "BackendUnavailableError",
    "BatchLayout",
    "PagedAttentionContext",
    "TorchAttentionBackend",
    "register_with_transformers",
    "select_backend",
]


class BackendUnavailableError(RuntimeError):
    pass


def select_backend(
    requested: str, device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int
) -> tuple[AttentionBackend, str]:
    """The backend to use, and why it was chosen (for the start-up log).

    "auto" takes flash-attn when every one of its constraints holds and falls
    back to torch otherwise; naming "flash_attn" explicitly fails instead.
    """
    if requested == "torch":
        return TorchAttentionBackend(), "requested"
    reason = flash_attn_unsupported_reason(device, dtype, block_size, head_dim)
    if requested == "flash_attn":
        if reason is not None:
            raise BackendUnavailableError(f"attention backend flash_attn unavailable: {reason}")
        from worker_svc.attention.flash_backend import FlashAttentionBackend

        return FlashAttentionBackend(), "requested"
    if requested != "auto":
        raise ValueError(f"unknown attention backend {requested!r}")
    if reason is None:
        from worker_svc.attention.flash_backend import FlashAttentionBackend

        return FlashAttentionBackend(), "auto"
    return TorchAttentionBackend(), f"auto ({reason})"
