"""Plugs the paged backends into transformers' attention interface.

transformers calls the registered function from every attention layer with
`(module, query, key, value, attention_mask, **kwargs)`, and forwards the
model call's extra keyword arguments into `kwargs`. The runner passes one
`PagedAttentionContext` under CONTEXT_KWARG, so the per-step metadata is
built once and every layer finds it there.

A matching entry in `AttentionMaskInterface` returns None, so that
transformers never builds a dense T x T mask for the flat batch: the backends
know each sequence's boundaries from the metadata.
"""

from __future__ import annotations

from typing import Any

import torch

from worker_svc.attention.base import PagedAttentionContext

ATTN_IMPLEMENTATION = "cbserve_paged"
CONTEXT_KWARG = "cbserve_attention"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    context = kwargs.get(CONTEXT_KWARG)
    if not isinstance(context, PagedAttentionContext):
        raise RuntimeError(
            f"the {ATTN_IMPLEMENTATION!r} attention needs a PagedAttentionContext "
            f"passed to the model call as {CONTEXT_KWARG}="
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # transformers hands `[1, heads, T, d]`; the backends take the flat `[T, heads, d]`.
    out = context.backend.forward(
        module.layer_idx,
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        context.pool,
        context.metadata,
        scale,
        # transformers' sliding layers (Gemma 3, Mistral, Qwen2) pass their window.
        window=kwargs.get("sliding_window"),
        # gpt-oss passes its per-head sink logits as `s_aux`: lost, its softmax is wrong.
        sinks=kwargs.get("s_aux"),
    )
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


def register_with_transformers() -> str:
    """Register (idempotently) and return the name to pass as `attn_implementation`."""
    # Imported here, not at the top: these pull in transformers' modeling modules
    # (seconds of a worker's start), which only the transformers fallback needs.
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
    return ATTN_IMPLEMENTATION
