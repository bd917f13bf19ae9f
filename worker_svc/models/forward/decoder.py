"""The float forward of every declared architecture over a flat packed batch, composed
from the declaration (models/declaration.py): what Llama, Mistral, Qwen2, Qwen3 and
Gemma 3 do differently is a field of their DecoderSpec, read here at build time.

One step's tokens, of all sequences, are one `[T, hidden]` tensor: no padding, no
batch dimension. Q, K and V come from one fused projection and gate/up from another,
so a layer makes 4 matmuls instead of 7; the attention backend reads and writes the
paged K/V store with the same `[T, heads, head_dim]` views the projections produce, so
no layer transposes. Logits are computed only for the rows that sample, and the last
layer's MLP runs only on those rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.attention import PagedAttentionContext
from worker_svc.compute.projections import make_projection
from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.delta import LayerLora, add_lora_delta
from worker_svc.models.checkpoint.experts import ExpertWeights, expert_weights
from worker_svc.models.declaration import EXPERT_ROLES, Architecture, DecoderSpec, LayerAttention
from worker_svc.models.forward.experts import ExpertMlp
from worker_svc.models.forward.layers import ACTIVATIONS, make_norm
from worker_svc.models.forward.rope import RotaryEmbedding, apply_rotary


class DecoderLayer(nn.Module):
    def __init__(
        self,
        spec: DecoderSpec,
        attention: LayerAttention,
        weights: Mapping[str, torch.Tensor],
        path: str,
        dtype: torch.dtype,
        norms_offset_applied: bool,
        experts: ExpertWeights | None = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.scale = spec.scale
        self.window = attention.window

        def norm(role: str):
            return make_norm(
                weights[role], spec.rms_norm_eps, spec.norm_one_plus, norms_offset_applied, dtype
            )

        self.attn_norm, self.mlp_norm = norm("attn_norm"), norm("mlp_norm")
        self.q_norm = norm("q_norm") if spec.qk_norm else None
        self.k_norm = norm("k_norm") if spec.qk_norm else None
        self.attn_post_norm = norm("attn_post_norm") if spec.sandwich_norms else None
        self.mlp_post_norm = norm("mlp_post_norm") if spec.sandwich_norms else None
        qkv_bias = None
        if spec.qkv_bias:
            qkv_bias = torch.cat([weights["q_bias"], weights["k_bias"], weights["v_bias"]])
        self.qkv_proj = make_projection(
            torch.cat([weights["q"], weights["k"], weights["v"]]), path, qkv_bias
        )
        self.o_proj = make_projection(weights["o"], path, weights.get("o_bias"))
        self.sinks = weights["sinks"].float() if spec.attention_sinks else None
        # A mixture layer (spec.moe) has its experts in place of the dense MLP.
        self.experts = ExpertMlp(spec.moe, experts, path) if experts is not None else None
        if experts is None:
            self.gate_up_proj = make_projection(torch.cat([weights["gate"], weights["up"]]), path)
            self.down_proj = make_projection(weights["down"], path)
        self.activation = ACTIVATIONS[spec.activation]
        # Its projections' LoRA slot tensors, with --enable-lora (lora/delta.py).
        self.lora: LayerLora | None = None

    def _lora(self, name: str, out: torch.Tensor, x: torch.Tensor, rows: LoraBatch | None):
        """out += the step's adapter deltas of projection `name` on its input x."""
        if rows is None or self.lora is None:
            return out
        return add_lora_delta(out, x, self.lora[name], rows)

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
        heads, kv_heads = self.num_heads, self.num_kv_heads
        lora = (
            attention.lora if attention.lora is not None and not attention.lora.is_empty else None
        )
        normed = self.attn_norm(hidden)
        qkv = self._lora("qkv", self.qkv_proj(normed), normed, lora)
        qkv = qkv.view(t, heads + 2 * kv_heads, self.head_dim)
        if self.q_norm is not None:
            query = apply_rotary(self.q_norm(qkv[:, :heads]), *rotary)
            key = apply_rotary(self.k_norm(qkv[:, heads : heads + kv_heads]), *rotary)
        else:
            # q and k are adjacent heads of the fused output: one rotary call for both.
            qk = apply_rotary(qkv[:, : heads + kv_heads], *rotary)
            query, key = qk[:, :heads], qk[:, heads:]
        value = qkv[:, heads + kv_heads :]
        attended = attention.backend.forward(
            layer_idx, query, key, value, attention.pool, attention.metadata, self.scale,
            window=self.window, sinks=self.sinks,
        )  # fmt: skip
        attended = attended.reshape(t, self.q_size)
        if keep_rows is not None:
            # Past the last attention nothing mixes tokens: only sampled rows go on.
            attended, hidden = attended[keep_rows], hidden[keep_rows]
            lora = lora.kept(keep_rows) if lora is not None else None
        out = self._lora("o", self.o_proj(attended), attended, lora)
        if self.attn_post_norm is not None:
            out = self.attn_post_norm(out)
        hidden = hidden + out
        if self.experts is not None:
            mlp = self.experts(self.mlp_norm(hidden))
        else:
            normed = self.mlp_norm(hidden)
            gate_up = self._lora("gate_up", self.gate_up_proj(normed), normed, lora)
            gated = self.activation(gate_up)
            mlp = self._lora("down", self.down_proj(gated), gated, lora)
        if self.mlp_post_norm is not None:
            mlp = self.mlp_post_norm(mlp)
        return hidden + mlp


class DecoderForCausalLM(nn.Module):
    """Built from a checkpoint's tensors under transformers' names (models/weights.py
    reads safetensors and GGUF into them) and its architecture's declaration."""

    def __init__(
        self,
        architecture: Architecture,
        spec: DecoderSpec,
        state: Mapping[str, torch.Tensor],
        path: str,
        dtype: torch.dtype,
        norms_offset_applied: bool = False,
    ):
        super().__init__()
        self.architecture, self.spec = architecture, spec
        names = architecture.hf_names
        self.embed_tokens = nn.Parameter(state[names["embed"]].to(dtype), requires_grad=False)
        # transformers multiplies by the scale as a tensor of the embedding's dtype.
        self.embed_scale = None
        if spec.embed_scale is not None:
            self.embed_scale = torch.tensor(spec.embed_scale, dtype=torch.float32).to(dtype)
        ropes = list(dict.fromkeys(layer.rope for layer in spec.layers))
        self.rotaries = nn.ModuleList(
            RotaryEmbedding(spec.head_dim, spec.max_positions, rope, dtype) for rope in ropes
        )
        self.layer_rope = [ropes.index(layer.rope) for layer in spec.layers]
        self.layers = nn.ModuleList(
            DecoderLayer(
                spec, attention, layer_weights(architecture, state, i, spec.is_sparse(i)), path,
                dtype, norms_offset_applied,
                expert_weights(architecture, state, i, spec.moe) if spec.is_sparse(i) else None,
            )
            for i, attention in enumerate(spec.layers)
        )  # fmt: skip
        self.norm = make_norm(
            state[names["final_norm"]], spec.rms_norm_eps, spec.norm_one_plus,
            norms_offset_applied, dtype,
        )  # fmt: skip
        # A tied head (SmolLM2, Qwen's small sizes, Gemma) has no lm_head in the file.
        head = names["embed"] if spec.tied_head or names["lm_head"] not in state else None
        self.lm_head = make_projection(state[head or names["lm_head"]], path)
        # A native decode step (models/qblock/native.py), set by the q4_1 path: it runs
        # the steps it can and returns None for the others.
        self.native_decode = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: PagedAttentionContext,
        sample_rows: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids, positions `[T]` -> logits `[len(sample_rows), vocab]` in float32."""
        # The native step adds the step's LoRA deltas itself (attention.lora, read in
        # place from the layers' slot tensors: kernels/decode_lora.h).
        if self.native_decode is not None:
            logits = self.native_decode(input_ids, positions, attention, sample_rows)
            if logits is not None:
                return logits
        hidden = F.embedding(input_ids, self.embed_tokens)
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        rotaries = [rotary.lookup(positions) for rotary in self.rotaries]
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            keep = sample_rows if index == last else None
            hidden = layer(index, hidden, rotaries[self.layer_rope[index]], attention, keep)
        return self.lm_head(self.norm(hidden)).float()


_DENSE_MLP_ROLES = frozenset({"gate", "up", "down"})


def layer_weights(
    architecture: Architecture, state: Mapping[str, torch.Tensor], index: int, sparse: bool = False
) -> dict[str, torch.Tensor]:
    """Layer `index`'s tensors by role (declaration.LAYER_ROLES) that the family has; a
    sparse layer's experts are read by checkpoint/experts.py, and it has no dense MLP."""
    skipped = frozenset(EXPERT_ROLES) | (_DENSE_MLP_ROLES if sparse else frozenset())
    return {
        role: state[name.format(i=index)]
        for role, name in architecture.hf_names.items()
        if "{i}" in name and role not in skipped
    }
