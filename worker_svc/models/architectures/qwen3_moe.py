"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their successors): Qwen3's attention
(q/k norms, no biases) with a mixture of experts in place of the MLP on the sparse
layers: softmax router over `num_experts` (transformers 5 names it
`num_local_experts`), top `num_experts_per_tok`, renormalized where `norm_topk_prob`;
SwiGLU experts of `moe_intermediate_size`. A layer in `mlp_only_layers`, or off the
`decoder_sparse_step`, keeps a dense MLP of `intermediate_size`."""

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
from worker_svc.models.architectures.qwen3 import NORM_ROLES, QWEN3_DEFAULTS
from worker_svc.models.declaration import Architecture, DecoderSpec
from worker_svc.models.mixture import MoeSpec, sparse_layers

QWEN3_MOE_DEFAULTS = {
    **{k: v for k, v in QWEN3_DEFAULTS.items() if k not in ("max_window_layers", "layer_types")},
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": None,
    "sliding_window": None,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "num_local_experts": 128,
    "num_experts": None,  # the name before transformers 5
    "norm_topk_prob": False,
    "mlp_only_layers": None,
    "max_window_layers": None,  # read by nothing: every layer or none slides
}
_IGNORED = frozenset({"output_router_logits", "router_aux_loss_coef"})
_LAYER = "model.layers.{i}.mlp."
QWEN3_MOE_HF_NAMES = {
    "router": _LAYER + "gate.weight",
    "expert_gate": _LAYER + "experts.{e}.gate_proj.weight",
    "expert_up": _LAYER + "experts.{e}.up_proj.weight",
    "expert_down": _LAYER + "experts.{e}.down_proj.weight",
    # Only a GGUF holds these; its stacked tensors take these names when read.
    "experts_gate": _LAYER + "experts.gate_stack",
    "experts_up": _LAYER + "experts.up_stack",
    "experts_down": _LAYER + "experts.down_stack",
}


def moe_spec(config) -> MoeSpec:
    """The mixture of a Qwen-MoE-shaped config (Qwen3-MoE; Qwen2-MoE but its shared expert)."""
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    return MoeSpec(
        num_experts=experts,
        experts_per_token=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size,
        sparse_layers=sparse_layers(
            config.num_hidden_layers, config.decoder_sparse_step, config.mlp_only_layers
        ),
        normalize_topk=bool(config.norm_topk_prob),
    )


def _spec(config) -> DecoderSpec:
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections (with o_proj's)")
    # transformers drops the window unless use_sliding_window; then every layer slides.
    window = getattr(config, "sliding_window", None)
    sliding = window is not None and getattr(config, "use_sliding_window", False)
    types = ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers
    spec = dense_spec(config, "qwen3_moe", types=types)
    return replace(spec, qk_norm=True, moe=moe_spec(config))


def _gguf_config(values: dict, get) -> None:
    """llama.cpp's names for the mixture; it always renormalizes Qwen3-MoE's top-k
    weights (the released checkpoints set norm_topk_prob) and stores no flag for it."""
    values.update(
        num_local_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
        moe_intermediate_size=int(get("expert_feed_forward_length")),
        norm_topk_prob=True,
        mlp_only_layers=[],
    )


ARCHITECTURE = Architecture(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    gguf_architecture="qwen3moe",
    model_types=("qwen3_moe",),
    config_defaults=QWEN3_MOE_DEFAULTS,
    spec=_spec,
    hf_names={**names(HF_NAMES, PLAIN_ROLES + NORM_ROLES), **QWEN3_MOE_HF_NAMES},
    gguf_names={**names(GGUF_NAMES, PLAIN_ROLES + NORM_ROLES), **GGUF_EXPERT_NAMES},
    gguf_config=_gguf_config,
    ignored_config_keys=_IGNORED,
)
