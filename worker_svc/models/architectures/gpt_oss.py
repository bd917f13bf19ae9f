"""gpt-oss (gpt-oss-20b, gpt-oss-120b): grouped-query attention with biases on q, k, v and
o, a learned sink logit per query head in every softmax, sliding-window layers (128
tokens) alternating with full ones, YaRN rope; every layer a mixture of experts with a
biased router whose top-k logits are softmaxed, and experts with biases and a clamped
SwiGLU (`swiglu_alpha`, `swiglu_limit`), stored by transformers as one fused
`gate_up_proj` per layer with gate and up in alternating columns.

Its RMSNorm multiplies by w in float32 before rounding (Llama's rounds first): equal in
float32, the reference; the float16/bfloat16 paths round as Llama's norm does.
"""

from __future__ import annotations

from dataclasses import replace

from worker_svc.models.architectures.llama import LLAMA_DEFAULTS, dense_spec
from worker_svc.models.architectures.names import (
    GGUF_EXPERT_NAMES,
    GGUF_NAMES,
    HF_NAMES,
    PLAIN_ROLES,
    names,
)
from worker_svc.models.declaration import Architecture, DecoderSpec
from worker_svc.models.mixture import MoeSpec

GPT_OSS_DEFAULTS = {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k != "mlp_bias"},
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "attention_bias": True,
    "layer_types": None,
}
_IGNORED = frozenset({"output_router_logits", "router_aux_loss_coef"})
_LAYER = "model.layers.{i}."
_DENSE_MLP = ("gate", "up", "down")
_PLAIN = tuple(r for r in PLAIN_ROLES if r not in _DENSE_MLP)
GPT_OSS_HF_NAMES = {
    "q_bias": _LAYER + "self_attn.q_proj.bias",
    "k_bias": _LAYER + "self_attn.k_proj.bias",
    "v_bias": _LAYER + "self_attn.v_proj.bias",
    "o_bias": _LAYER + "self_attn.o_proj.bias",
    "sinks": _LAYER + "self_attn.sinks",
    "router": _LAYER + "mlp.router.weight",
    "router_bias": _LAYER + "mlp.router.bias",
    "experts_gate_up_interleaved": _LAYER + "mlp.experts.gate_up_proj",
    "experts_gate_up_interleaved_bias": _LAYER + "mlp.experts.gate_up_proj_bias",
    "experts_down_transposed": _LAYER + "mlp.experts.down_proj",
    "experts_down_bias": _LAYER + "mlp.experts.down_proj_bias",
    # Only a GGUF holds these: llama.cpp's converter de-interleaves gate and up into
    # stacked `*_exps` tensors; its down bias is transformers' layout already.
    "experts_gate": _LAYER + "mlp.experts.gate_stack",
    "experts_up": _LAYER + "mlp.experts.up_stack",
    "experts_down": _LAYER + "mlp.experts.down_stack",
    "experts_gate_bias": _LAYER + "mlp.experts.gate_stack_bias",
    "experts_up_bias": _LAYER + "mlp.experts.up_stack_bias",
}
GPT_OSS_GGUF_NAMES = {
    **names(GGUF_NAMES, _PLAIN + ("q_bias", "k_bias", "v_bias")),
    **GGUF_EXPERT_NAMES,
    "o_bias": "blk.{i}.attn_output.bias",
    "sinks": "blk.{i}.attn_sinks.weight",
    # gpt-oss's norm before the MLP is llama.cpp's post_attention_norm, not ffn_norm.
    "mlp_norm": "blk.{i}.post_attention_norm.weight",
}


def _gguf_config(values: dict, get) -> None:
    """What llama.cpp stores under its own names or fixes for gpt-oss: the experts,
    every other layer sliding (from the first), YaRN's parameters (transformers' gpt-oss
    does not truncate its ramp). alpha and limit are not stored: the defaults hold."""
    values.update(
        num_local_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
        intermediate_size=int(get("expert_feed_forward_length")),
        layer_types=[
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(values["num_hidden_layers"])
        ],
    )
    if get("rope.scaling.type") == "yarn":
        values["rope_parameters"] = {
            "rope_type": "yarn",
            "rope_theta": float(get("rope.freq_base")),
            "factor": float(get("rope.scaling.factor")),
            "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
            "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0)),
            "truncate": False,
        }


def _spec(config) -> DecoderSpec:
    if not getattr(config, "attention_bias", True):
        raise NotImplementedError("gpt-oss without attention biases")
    spec = dense_spec(config, "gpt_oss", qkv_bias=True)
    moe = MoeSpec(
        num_experts=config.num_local_experts,
        experts_per_token=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)),
        router="topk_softmax",
        router_bias=True,
        expert_bias=True,
        activation="swiglu_clamped",
        swiglu_alpha=float(config.swiglu_alpha),
        swiglu_limit=float(config.swiglu_limit),
    )
    return replace(spec, o_bias=True, attention_sinks=True, moe=moe)


ARCHITECTURE = Architecture(
    name="gpt_oss",
    hf_architectures=("GptOssForCausalLM",),
    gguf_architecture="gpt-oss",
    model_types=("gpt_oss",),
    config_defaults=GPT_OSS_DEFAULTS,
    spec=_spec,
    hf_names={**names(HF_NAMES, _PLAIN), **GPT_OSS_HF_NAMES},
    gguf_names=GPT_OSS_GGUF_NAMES,
    gguf_config=_gguf_config,
    ignored_config_keys=_IGNORED,
)
