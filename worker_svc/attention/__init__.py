"""Attention backends behind one interface, and the choice between them."""

from __future__ import annotations

import torch

from worker_svc.attention.base import AttentionBackend, BatchLayout, PagedAttentionContext
from worker_svc.attention.cpu_backend import CpuAttentionBackend, kernel_cache_unsupported_reason
from worker_svc.attention.cpu_kernel import cpu_kernel_unsupported_reason
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
    "CpuAttentionBackend",
    "PagedAttentionContext",
    "TorchAttentionBackend",
    "register_with_transformers",
    "select_backend",
]


class BackendUnavailableError(RuntimeError):
    pass


def select_backend(
    requested: str,
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
    sinks: bool = False,
) -> tuple[AttentionBackend, str]:
    """The backend to use, and why it was chosen (for the start-up log).

    "auto" takes flash-attn when every one of its constraints holds, else the
    CPU kernel when it builds and fits, else torch; naming "flash_attn" or
    "cpu" explicitly fails instead of falling back. "torch" is the reference.
    `dtype` is the model's compute dtype, `kv_dtype` the pool's (default: the same).
    `sinks`: the model has attention sinks (gpt-oss), which flash-attn lacks.
    """
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if requested == "torch":
        return TorchAttentionBackend(), "requested"
    if requested not in ("auto", "flash_attn", "cpu"):
        raise ValueError(f"unknown attention backend {requested!r}")
    flash_reason = (
        flash_attn_unsupported_reason(device, dtype, block_size, head_dim, kv_dtype)
        if requested != "cpu"
        else None
    )
    if requested != "cpu" and sinks and flash_reason is None:
        flash_reason = "flash_attn has no attention sinks (gpt-oss)"
    if requested == "flash_attn":
        if flash_reason is not None:
            raise BackendUnavailableError(
                f"attention backend flash_attn unavailable: {flash_reason}"
            )
        from worker_svc.attention.flash_backend import FlashAttentionBackend

        return FlashAttentionBackend(), "requested"
    if requested == "auto" and flash_reason is None:
        from worker_svc.attention.flash_backend import FlashAttentionBackend

        return FlashAttentionBackend(), "auto"
    cpu_reason = cpu_kernel_unsupported_reason(device, dtype)
    cpu_reason = cpu_reason or kernel_cache_unsupported_reason(kv_dtype)
    if requested == "cpu":
        if cpu_reason is not None:
            raise BackendUnavailableError(f"attention backend cpu unavailable: {cpu_reason}")
        return CpuAttentionBackend(), "requested"
    if cpu_reason is None:
        return CpuAttentionBackend(), f"auto ({flash_reason})"
    return TorchAttentionBackend(), f"auto ({flash_reason}; {cpu_reason})"
