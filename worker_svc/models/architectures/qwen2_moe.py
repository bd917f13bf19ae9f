"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (biases on q, k and
v) with Qwen3-MoE's router (softmax in float32, top `num_experts_per_tok` of
`num_experts`, renormalized where `norm_topk_prob`) and SwiGLU experts of
`moe_intermediate_size`, plus a shared expert: a dense SwiGLU MLP of
`shared_expert_intermediate_size` that every token runs, scaled by
`sigmoid(shared_expert_gate(x))` and added to the routed experts' sum. A layer in
`mlp_only_layers`, or off the `decoder_sparse_step`, keeps a dense MLP of
`intermediate_size`.

Its window rule is its own: with `use_sliding_window`, layer i slides where i is even
and below `max_window_layers` (transformers' Qwen2MoeConfig), unless the config lists
`layer_types`."""

from __future__ import annotations

from dataclasses import replace

from worker_svc.models.architectures.llama import dense_spec
from worker_svc.models.architectures.names import (
    GGUF_EXPERT_NAMES,
    GGUF_NAMES,
    HF_NAMES,
    PLAIN_ROLES,
    names,
)
from worker_svc.models.architectures.qwen2 import BIAS_ROLES, QWEN2_DEFAULTS
from worker_svc.models.architectures.qwen3_moe import QWEN3_MOE_HF_NAMES, moe_spec
from worker_svc.models.declaration import Architecture, DecoderSpec

QWEN2_MOE_DEFAULTS = {
    **QWEN2_DEFAULTS,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 32768,
    "qkv_bias": True,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4,
    "num_experts": 60,
    "norm_topk_prob": False,
    "mlp_only_layers": None,
}
_IGNORED = frozenset({"output_router_logits", "router_aux_loss_coef"})
_LAYER = "model.layers.{i}.mlp."
QWEN2_MOE_HF_NAMES = {
    **QWEN3_MOE_HF_NAMES,
    "shared_gate": _LAYER + "shared_expert.gate_proj.weight",
    "shared_up": _LAYER + "shared_expert.up_proj.weight",
    "shared_down": _LAYER + "shared_expert.down_proj.weight",
    "shared_gate_inp": _LAYER + "shared_expert_gate.weight",
}
GGUF_SHARED_EXPERT_NAMES = {
    "shared_gate": "blk.{i}.ffn_gate_shexp.weight",
    "shared_up": "blk.{i}.ffn_up_shexp.weight",
    "shared_down": "blk.{i}.ffn_down_shexp.weight",
    "shared_gate_inp": "blk.{i}.ffn_gate_inp_shexp.weight",
}


def qwen2_moe_layer_types(config) -> list[str]:
    """transformers' Qwen2-MoE rule (see the module's docstring)."""
    listed = getattr(config, "layer_types", None)
    if not getattr(config, "use_sliding_window", False) or not config.sliding_window:
        return ["full_attention"] * config.num_hidden_layers
    if listed:
        return list(listed)
    first_full = getattr(config, "max_window_layers", 28)
    return [
        "sliding_attention" if (i + 1) % 2 and i < first_full else "full_attention"
        for i in range(config.num_hidden_layers)
    ]


def _spec(config) -> DecoderSpec:
    if not getattr(config, "qkv_bias", True):
        raise NotImplementedError("Qwen2-MoE without its q/k/v biases")
    spec = dense_spec(config, "qwen2_moe", qkv_bias=True, types=qwen2_moe_layer_types(config))
    moe = replace(
        moe_spec(config),
        shared_intermediate_size=config.shared_expert_intermediate_size,
        shared_expert_gated=True,
    )
    return replace(spec, moe=moe)


def _gguf_config(values: dict, get) -> None:
    """llama.cpp's names for the mixture. Its qwen2moe graph never renormalizes the
    top-k weights (the released checkpoints leave norm_topk_prob off), stores no flag
    for it, and makes every layer sparse."""
    values.update(
        num_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
        moe_intermediate_size=int(get("expert_feed_forward_length")),
        shared_expert_intermediate_size=int(get("expert_shared_feed_forward_length")),
        norm_topk_prob=False,
        mlp_only_layers=[],
        decoder_sparse_step=1,
    )


_ROLES = PLAIN_ROLES + BIAS_ROLES
ARCHITECTURE = Architecture(
    name="qwen2_moe",
    hf_architectures=("Qwen2MoeForCausalLM",),
    gguf_architecture="qwen2moe",
    model_types=("qwen2_moe",),
    config_defaults=QWEN2_MOE_DEFAULTS,
    spec=_spec,
    hf_names={**names(HF_NAMES, _ROLES), **QWEN2_MOE_HF_NAMES},
    gguf_names={**names(GGUF_NAMES, _ROLES), **GGUF_EXPERT_NAMES, **GGUF_SHARED_EXPERT_NAMES},
    gguf_config=_gguf_config,
    ignored_config_keys=_IGNORED,
)
