"""Llama (2, 3.x; SmolLM; TinyLlama): the reference layout. Grouped-query attention,
SiLU MLP, RMSNorm before attention and before the MLP, no biases unless the config
asks (`attention_bias`), rotate-half rotary with Llama 3.1's frequency scaling
(`rope_type: llama3`) or linear scaling where the config has them; tied or untied head.

llama.cpp writes its q/k rows in interleaved pairs (NORM rope); the readers undo it.
"""

from __future__ import annotations

from worker_svc.models.architectures.names import GGUF_NAMES, HF_NAMES, PLAIN_ROLES, names
from worker_svc.models.config_file import (
    activation_name,
    decoder_shape,
    layer_types,
    rope_parameters,
    rope_spec,
)
from worker_svc.models.declaration import Architecture, DecoderSpec, LayerAttention

BIAS_ROLES = ("q_bias", "k_bias", "v_bias")

# LlamaConfig's defaults for keys a config.json may leave out (transformers 5.x).
LLAMA_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
}


def dense_spec(config, name: str, qkv_bias: bool = False, types: list[str] | None = None):
    """The spec of a Llama-shaped decoder (Llama, Mistral, Qwen2/3), each layer windowed
    where its layer types (by default the config's) say so. Raises NotImplementedError
    for a setting the own forward does not compute."""
    if getattr(config, "mlp_bias", False):
        raise NotImplementedError("biased MLP projections")
    rope = rope_spec(rope_parameters(config), 10000.0, config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    types = types if types is not None else layer_types(config)
    if len(types) != config.num_hidden_layers:
        raise ValueError(f"{len(types)} layer_types for {config.num_hidden_layers} layers")
    layers = tuple(
        LayerAttention(rope, window if kind == "sliding_attention" else None) for kind in types
    )
    return DecoderSpec(
        architecture=name,
        **decoder_shape(config, tied_by_default=False),
        layers=layers,
        qkv_bias=qkv_bias,
        activation=activation_name(getattr(config, "hidden_act", "silu")),
    )


def _llama_spec(config) -> DecoderSpec:
    # Llama's attention_bias puts a bias on o_proj too, which no path computes.
    if getattr(config, "attention_bias", False):
        raise NotImplementedError("biased attention projections (with o_proj's)")
    return dense_spec(config, "llama")


ARCHITECTURE = Architecture(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    gguf_architecture="llama",
    model_types=("llama",),
    config_defaults=LLAMA_DEFAULTS,
    spec=_llama_spec,
    hf_names=names(HF_NAMES, PLAIN_ROLES),
    gguf_names=names(GGUF_NAMES, PLAIN_ROLES),
    gguf_permutes_qk=True,
)
