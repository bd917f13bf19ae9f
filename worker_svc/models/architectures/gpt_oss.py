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
from worker_svc.models.architectures.names import HF_NAMES, PLAIN_ROLES, names
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
    hf_names={
        **names(HF_NAMES, tuple(r for r in PLAIN_ROLES if r not in _DENSE_MLP)),
        **GPT_OSS_HF_NAMES,
    },
    # llama.cpp's gpt-oss files (MXFP4 experts) are not read by the own forward yet.
    gguf_names={},
    ignored_config_keys=_IGNORED,
)
