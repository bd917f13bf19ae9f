"""Qwen2 and Qwen2.5: the Llama layout with biases on q, k and v (not on o), a larger
rope base, and a sliding window only where the config turns it on
(`use_sliding_window`, then for the layers from `max_window_layers`). llama.cpp keeps
their rotate-half rotary (NEOX): no q/k reordering to undo."""

from __future__ import annotations

from worker_svc.models.architectures.llama import LLAMA_DEFAULTS, dense_spec
from worker_svc.models.architectures.names import GGUF_NAMES, HF_NAMES, PLAIN_ROLES, names
from worker_svc.models.declaration import Architecture, DecoderSpec

QWEN2_DEFAULTS = {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("attention_bias", "mlp_bias")},
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
}
BIAS_ROLES = ("q_bias", "k_bias", "v_bias")


def windowed_layer_types(config) -> list[str]:
    """transformers' Qwen rule: sliding only when `use_sliding_window`, and then from
    layer `max_window_layers` on (a config may also list the types itself)."""
    if not getattr(config, "use_sliding_window", False) or config.sliding_window is None:
        return ["full_attention"] * config.num_hidden_layers
    listed = getattr(config, "layer_types", None)
    if listed:
        return list(listed)
    first = getattr(config, "max_window_layers", 28)
    return [
        "sliding_attention" if i >= first else "full_attention"
        for i in range(config.num_hidden_layers)
    ]


def _spec(config) -> DecoderSpec:
    return dense_spec(config, "qwen2", qkv_bias=True, types=windowed_layer_types(config))


ARCHITECTURE = Architecture(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    gguf_architecture="qwen2",
    model_types=("qwen2",),
    config_defaults=QWEN2_DEFAULTS,
    spec=_spec,
    hf_names=names(HF_NAMES, PLAIN_ROLES + BIAS_ROLES),
    gguf_names=names(GGUF_NAMES, PLAIN_ROLES + BIAS_ROLES),
)
