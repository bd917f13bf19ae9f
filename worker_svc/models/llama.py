"""The Llama family's forward over a flat packed batch (Llama, SmolLM, Mistral-style
dense models with grouped-query attention and no biases).

One step's tokens, of all sequences, are one `[T, hidden]` tensor: no padding, no
batch dimension. Q, K and V come from one fused projection and gate/up from
another, so a layer makes 4 matmuls instead of 7; the attention backend reads and
writes the paged K/V store with the same `[T, heads, head_dim]` views the
projections produce, so no layer transposes. Logits are computed only for the
rows that sample, and the last layer's MLP runs only on those rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.attention import PagedAttentionContext
from worker_svc.compute.linear import make_projection
from worker_svc.models.dims import attention_dims
from worker_svc.models.layers import RMSNorm, RotaryEmbedding, apply_rotary, silu_and_mul


@dataclass(frozen=True)
class LlamaShape:
    """What the forward needs from a transformers config, checked once."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def from_config(cls, config) -> LlamaShape:
        """Raises NotImplementedError for what this forward does not compute (the caller
        falls back to transformers)."""
        rope = getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise NotImplementedError(f"rope_type {rope_type!r}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r}")
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise NotImplementedError("biased projections")
        heads, kv_heads, head_dim = attention_dims(config)
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=config.vocab_size,
            max_positions=config.max_position_embeddings,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
        )


class LlamaDecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape, weights: dict[str, torch.Tensor], path: str, dtype):
        super().__init__()
        self.q_size = shape.num_heads * shape.head_dim
        self.kv_size = shape.num_kv_heads * shape.head_dim
        self.num_heads, self.num_kv_heads = shape.num_heads, shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.scale = shape.head_dim**-0.5
        self.input_norm = RMSNorm(weights["input_layernorm"].to(dtype), shape.rms_norm_eps)
        self.post_attention_norm = RMSNorm(
            weights["post_attention_layernorm"].to(dtype), shape.rms_norm_eps
        )
        self.qkv_proj = make_projection(
            torch.cat([weights["q_proj"], weights["k_proj"], weights["v_proj"]]), path
        )
        self.o_proj = make_projection(weights["o_proj"], path)
        self.gate_up_proj = make_projection(
            torch.cat([weights["gate_proj"], weights["up_proj"]]), path
        )
        self.down_proj = make_projection(weights["down_proj"], path)

    def forward(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attention: PagedAttentionContext,
        keep_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """hidden `[T, hidden]` -> `[T, hidden]`, or `[len(keep_rows), hidden]` when given."""
        t = hidden.shape[0]
        qkv = self.qkv_proj(self.input_norm(hidden)).view(
            t, self.num_heads + 2 * self.num_kv_heads, self.head_dim
        )
        # q and k are adjacent heads of the fused output: one rotary call for both.
        qk = apply_rotary(qkv[:, : self.num_heads + self.num_kv_heads], *rotary)
        query, key = qk[:, : self.num_heads], qk[:, self.num_heads :]
        value = qkv[:, self.num_heads + self.num_kv_heads :]
        attended = attention.backend.forward(
            layer_idx, query, key, value, attention.pool, attention.metadata, self.scale
        )
        attended = attended.reshape(t, self.q_size)
        if keep_rows is not None:
            # Past the last attention nothing mixes tokens: only sampled rows go on.
            attended, hidden = attended[keep_rows], hidden[keep_rows]
        hidden = hidden + self.o_proj(attended)
        mlp = self.down_proj(silu_and_mul(self.gate_up_proj(self.post_attention_norm(hidden))))
        return hidden + mlp


class LlamaForCausalLM(nn.Module):
    """Built from a state dict with transformers' Llama names (see models.weights)."""

    @staticmethod
    def shape_class() -> type[LlamaShape]:
        return LlamaShape

    def __init__(self, shape: LlamaShape, state: dict[str, torch.Tensor], path: str, dtype):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Parameter(
            state["model.embed_tokens.weight"].to(dtype), requires_grad=False
        )
        self.rotary = RotaryEmbedding(shape.head_dim, shape.max_positions, shape.rope_theta, dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(shape, _layer_weights(state, i), path, dtype)
            for i in range(shape.num_layers)
        )
        self.norm = RMSNorm(state["model.norm.weight"].to(dtype), shape.rms_norm_eps)
        # Tied embeddings (SmolLM2) have no lm_head in the checkpoint.
        lm_head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
        self.lm_head = make_projection(lm_head, path)
        # A native decode step (models/llama_native.py), set by the q4_1 path: it runs the
        # steps it can and returns None for the others.
        self.native_decode = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: PagedAttentionContext,
        sample_rows: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids, positions `[T]` -> logits `[len(sample_rows), vocab]` in float32."""
        if self.native_decode is not None:
            logits = self.native_decode(input_ids, positions, attention, sample_rows)
            if logits is not None:
                return logits
        hidden = F.embedding(input_ids, self.embed_tokens)
        rotary = self.rotary.lookup(positions)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            keep = sample_rows if index == last else None
            hidden = layer(index, hidden, rotary, attention, keep)
        return self.lm_head(self.norm(hidden)).float()


def _layer_weights(state: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    prefix = f"model.layers.{index}."
    names = {
        "input_layernorm": "input_layernorm.weight",
        "post_attention_layernorm": "post_attention_layernorm.weight",
        "q_proj": "self_attn.q_proj.weight",
        "k_proj": "self_attn.k_proj.weight",
        "v_proj": "self_attn.v_proj.weight",
        "o_proj": "self_attn.o_proj.weight",
        "gate_proj": "mlp.gate_proj.weight",
        "up_proj": "mlp.up_proj.weight",
        "down_proj": "mlp.down_proj.weight",
    }
    return {key: state[prefix + name] for key, name in names.items()}
