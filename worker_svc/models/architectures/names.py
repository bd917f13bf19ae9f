"""Weight names shared by the families, by role (declaration.LAYER_ROLES): transformers'
in a safetensors checkpoint, llama.cpp's in a GGUF file. An architecture takes these
and renames what it calls otherwise (Gemma's four norms)."""

from __future__ import annotations

_LAYER = "model.layers.{i}."

HF_NAMES: dict[str, str] = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "attn_norm": _LAYER + "input_layernorm.weight",
    "q": _LAYER + "self_attn.q_proj.weight",
    "k": _LAYER + "self_attn.k_proj.weight",
    "v": _LAYER + "self_attn.v_proj.weight",
    "o": _LAYER + "self_attn.o_proj.weight",
    "q_bias": _LAYER + "self_attn.q_proj.bias",
    "k_bias": _LAYER + "self_attn.k_proj.bias",
    "v_bias": _LAYER + "self_attn.v_proj.bias",
    "q_norm": _LAYER + "self_attn.q_norm.weight",
    "k_norm": _LAYER + "self_attn.k_norm.weight",
    # Llama's "post_attention_layernorm" is the norm before the MLP.
    "mlp_norm": _LAYER + "post_attention_layernorm.weight",
    "gate": _LAYER + "mlp.gate_proj.weight",
    "up": _LAYER + "mlp.up_proj.weight",
    "down": _LAYER + "mlp.down_proj.weight",
}

GGUF_NAMES: dict[str, str] = {
    "embed": "token_embd.weight",
    "final_norm": "output_norm.weight",
    "lm_head": "output.weight",
    "attn_norm": "blk.{i}.attn_norm.weight",
    "q": "blk.{i}.attn_q.weight",
    "k": "blk.{i}.attn_k.weight",
    "v": "blk.{i}.attn_v.weight",
    "o": "blk.{i}.attn_output.weight",
    "q_bias": "blk.{i}.attn_q.bias",
    "k_bias": "blk.{i}.attn_k.bias",
    "v_bias": "blk.{i}.attn_v.bias",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "attn_post_norm": "blk.{i}.post_attention_norm.weight",
    "mlp_norm": "blk.{i}.ffn_norm.weight",
    "gate": "blk.{i}.ffn_gate.weight",
    "up": "blk.{i}.ffn_up.weight",
    "down": "blk.{i}.ffn_down.weight",
    "mlp_post_norm": "blk.{i}.post_ffw_norm.weight",
}

PLAIN_ROLES = (
    "embed",
    "final_norm",
    "lm_head",
    "attn_norm",
    "q",
    "k",
    "v",
    "o",
    "mlp_norm",
    "gate",
    "up",
    "down",
)


def names(table: dict[str, str], roles: tuple[str, ...], **renamed: str) -> dict[str, str]:
    """The roles a family has, from a shared table, with its own names for some."""
    chosen = {role: table[role] for role in roles if role not in renamed}
    chosen.update(renamed)
    return chosen


# llama.cpp's mixture tensors: the router, and each projection of every expert stacked
# into one 3-D tensor (`[experts, out, in]` once its dimensions are reversed).
GGUF_EXPERT_NAMES: dict[str, str] = {
    "router": "blk.{i}.ffn_gate_inp.weight",
    "router_bias": "blk.{i}.ffn_gate_inp.bias",
    "experts_gate": "blk.{i}.ffn_gate_exps.weight",
    "experts_up": "blk.{i}.ffn_up_exps.weight",
    "experts_down": "blk.{i}.ffn_down_exps.weight",
    "experts_gate_bias": "blk.{i}.ffn_gate_exps.bias",
    "experts_up_bias": "blk.{i}.ffn_up_exps.bias",
    "experts_down_bias": "blk.{i}.ffn_down_exps.bias",
}
