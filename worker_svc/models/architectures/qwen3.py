"""Qwen3: Qwen2's layout without its biases (unless `attention_bias`), with an RMSNorm
over each head of q and k before rotary, and a head_dim that the config sets on its own
(128 on every size, wider than hidden / heads on the small ones)."""

from __future__ import annotations

from dataclasses import replace

from worker_svc.models.architectures.llama import dense_spec
from worker_svc.models.architectures.names import GGUF_NAMES, HF_NAMES, PLAIN_ROLES, names
from worker_svc.models.architectures.qwen2 import QWEN2_DEFAULTS, windowed_layer_types
from worker_svc.models.declaration import Architecture, DecoderSpec

QWEN3_DEFAULTS = {
    **QWEN2_DEFAULTS,
    "intermediate_size": 22016,
    "head_dim": 128,
    "attention_bias": False,
}
NORM_ROLES = ("q_norm", "k_norm")


def _spec(config) -> DecoderSpec:
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections (with o_proj's)")
    spec = dense_spec(config, "qwen3", types=windowed_layer_types(config))
    return replace(spec, qk_norm=True)


ARCHITECTURE = Architecture(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    gguf_architecture="qwen3",
    model_types=("qwen3",),
    config_defaults=QWEN3_DEFAULTS,
    spec=_spec,
    hf_names=names(HF_NAMES, PLAIN_ROLES + NORM_ROLES),
    gguf_names=names(GGUF_NAMES, PLAIN_ROLES + NORM_ROLES),
)
