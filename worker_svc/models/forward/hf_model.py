"""transformers' own modules behind the same call as the own forwards.

The fallback for architectures without an own forward (`--model-impl transformers`,
or `auto` when the registry has none): transformers' model runs with the paged
attention registered through its attention interface (attention.transformers_hook),
on a `[1, T]` batch, and only the sampled rows' logits are computed.
"""

from __future__ import annotations

import torch
from torch import nn

from worker_svc.attention import CONTEXT_KWARG, PagedAttentionContext


class TransformersCausalLM(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: PagedAttentionContext,
        sample_rows: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids, positions `[T]` -> logits `[len(sample_rows), vocab]` in float32."""
        output = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=sample_rows,
            **{CONTEXT_KWARG: attention},
        )
        return output.logits[0].float()
