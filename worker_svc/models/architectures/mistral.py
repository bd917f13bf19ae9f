"""Mistral and Ministral: the Llama layout with a sliding window. Mistral's window (when
its config has one) covers every layer; Ministral declares per-layer types, alternating
sliding and full attention. The GGUF converter writes them as llama (permuted q/k)."""

from __future__ import annotations

from dataclasses import replace

from worker_svc.models.architectures.llama import ARCHITECTURE as LLAMA
from worker_svc.models.architectures.llama import LLAMA_DEFAULTS, dense_spec
from worker_svc.models.declaration import DecoderSpec

MISTRAL_DEFAULTS = {
    **LLAMA_DEFAULTS,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "sliding_window": 4096,
    "layer_types": None,
}


def _spec(config) -> DecoderSpec:
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections (with o_proj's)")
    return dense_spec(config, "mistral")


ARCHITECTURE = replace(
    LLAMA,
    name="mistral",
    hf_architectures=("MistralForCausalLM", "MinistralForCausalLM"),
    model_types=("mistral", "ministral"),
    config_defaults=MISTRAL_DEFAULTS,
    spec=_spec,
)
