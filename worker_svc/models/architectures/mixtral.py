"""Mixtral (8x7B, 8x22B): Mistral's attention with a mixture of experts on every layer:
softmax router, top `num_experts_per_tok` of `num_local_experts`, always renormalized
and kept in float32; SwiGLU experts (`w1` gate, `w3` up, `w2` down) of
`intermediate_size`. llama.cpp's converter writes it as llama (permuted q/k) with
stacked `*_exps` experts."""

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

MIXTRAL_DEFAULTS = {
    **LLAMA_DEFAULTS,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "sliding_window": None,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "router_jitter_noise": 0.0,  # training only
}
_IGNORED = frozenset({"output_router_logits", "router_aux_loss_coef"})
_DENSE_MLP = ("gate", "up", "down")
_LAYER = "model.layers.{i}.block_sparse_moe."
MIXTRAL_HF_NAMES = {
    "router": _LAYER + "gate.weight",
    "expert_gate": _LAYER + "experts.{e}.w1.weight",
    "expert_up": _LAYER + "experts.{e}.w3.weight",
    "expert_down": _LAYER + "experts.{e}.w2.weight",
    "experts_gate": _LAYER + "experts.gate_stack",
    "experts_up": _LAYER + "experts.up_stack",
    "experts_down": _LAYER + "experts.down_stack",
}


def _spec(config) -> DecoderSpec:
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections (with o_proj's)")
    spec = dense_spec(config, "mixtral")
    moe = MoeSpec(
        num_experts=config.num_local_experts,
        experts_per_token=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)),
        weights_in_activation_dtype=False,
    )
    return replace(spec, moe=moe)


def _gguf_config(values: dict, get) -> None:
    values.update(
        num_local_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
    )


ARCHITECTURE = Architecture(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    gguf_architecture="llama",
    model_types=("mixtral",),
    config_defaults=MIXTRAL_DEFAULTS,
    spec=_spec,
    hf_names={
        **names(HF_NAMES, tuple(r for r in PLAIN_ROLES if r not in _DENSE_MLP)),
        **MIXTRAL_HF_NAMES,
    },
    gguf_names={
        **names(GGUF_NAMES, tuple(r for r in PLAIN_ROLES if r not in _DENSE_MLP)),
        **GGUF_EXPERT_NAMES,
    },
    gguf_permutes_qk=True,
    gguf_config=_gguf_config,
    ignored_config_keys=_IGNORED,
)
