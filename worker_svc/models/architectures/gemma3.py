"""Gemma 3 (text): five sliding-window layers to one global, each kind with its own rope
base (10k local, 1M global, the global one scaled on the larger sizes); the embedding
scaled by sqrt(hidden); four norms a layer (before and after attention, before and after
the MLP) that multiply by (1 + w); per-head q/k norms; GELU-tanh; attention scaled by
`query_pre_attn_scalar` ** -0.5 rather than head_dim's. llama.cpp's converter writes the
norms with the 1 already added and keeps rotate-half rotary (NEOX)."""

from __future__ import annotations

from worker_svc.models.architectures.names import GGUF_NAMES, HF_NAMES, PLAIN_ROLES, names
from worker_svc.models.config_file import activation_name, decoder_shape, rope_spec
from worker_svc.models.declaration import Architecture, DecoderSpec, LayerAttention

# Gemma3TextConfig's defaults (transformers 5.x).
GEMMA3_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "layer_types": None,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
    "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6,
    "_sliding_window_pattern": 6,
}
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0
NORM_ROLES = ("q_norm", "k_norm", "attn_post_norm", "mlp_post_norm")


def _layer_types(config) -> list[str]:
    listed = getattr(config, "layer_types", None)
    if listed:
        return list(listed)
    every = getattr(config, "_sliding_window_pattern", None) or getattr(
        config, "sliding_window_pattern", 6
    )
    return [
        "sliding_attention" if (i + 1) % every else "full_attention"
        for i in range(config.num_hidden_layers)
    ]


def _rope(config, layer_type: str):
    """Gemma 3's per-kind rope: `rope_parameters` keyed by layer type (transformers 5),
    else the older `rope_theta` / `rope_local_base_freq`, `rope_scaling` on global only."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type in params:
        return rope_spec(dict(params[layer_type]), 10000.0)
    if layer_type == "sliding_attention":
        return rope_spec({"rope_theta": getattr(config, "rope_local_base_freq", LOCAL_THETA)}, 0)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_theta", getattr(config, "rope_theta", None) or GLOBAL_THETA)
    return rope_spec(scaling, GLOBAL_THETA)


def _spec(config) -> DecoderSpec:
    if getattr(config, "use_bidirectional_attention", False):
        raise NotImplementedError("bidirectional attention")
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections")
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(config, cap, None) is not None:
            raise NotImplementedError(cap)
    window = config.sliding_window
    layers = tuple(
        LayerAttention(_rope(config, kind), window if kind == "sliding_attention" else None)
        for kind in _layer_types(config)
    )
    return DecoderSpec(
        architecture="gemma3",
        **decoder_shape(config, tied_by_default=True),
        layers=layers,
        qk_norm=True,
        norm_one_plus=True,
        sandwich_norms=True,
        activation=activation_name(getattr(config, "hidden_activation", "gelu_pytorch_tanh")),
        embed_scale=float(config.hidden_size) ** 0.5,
        attention_scale=float(config.query_pre_attn_scalar) ** -0.5,
    )


def _gguf_config(values: dict, get) -> None:
    """What llama.cpp fixes for Gemma 3 rather than storing: every sixth layer global,
    the local rope base (stored since 2025 as freq_base_swa), and the attention scale,
    by head_dim except on the 27B (62 layers), which scales by hidden / heads."""
    values["rope_parameters"] = {
        "full_attention": values["rope_parameters"],
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": float(get("rope.freq_base_swa", LOCAL_THETA)),
        },
    }
    values["layer_types"] = None  # the pattern of six
    wide = values["num_hidden_layers"] == 62
    heads = values["num_attention_heads"]
    values["query_pre_attn_scalar"] = values["hidden_size"] // heads if wide else values["head_dim"]


ARCHITECTURE = Architecture(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM",),
    gguf_architecture="gemma3",
    model_types=("gemma3_text",),
    config_defaults=GEMMA3_DEFAULTS,
    spec=_spec,
    hf_names=names(
        HF_NAMES,
        PLAIN_ROLES + NORM_ROLES,
        attn_post_norm="model.layers.{i}.post_attention_layernorm.weight",
        mlp_norm="model.layers.{i}.pre_feedforward_layernorm.weight",
        mlp_post_norm="model.layers.{i}.post_feedforward_layernorm.weight",
    ),
    gguf_names=names(GGUF_NAMES, PLAIN_ROLES + NORM_ROLES),
    gguf_norms_plus_one=True,
    gguf_config=_gguf_config,
)
