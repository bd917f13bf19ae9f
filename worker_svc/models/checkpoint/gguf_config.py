"""A GGUF file's model config, read from its own metadata as llama.cpp reads it, without
transformers: the numbers of `{arch}.*`, the head tied where there is no `output.weight`,
Llama 3's rope scaling from its `rope_freqs` tensor (the converter writes the
per-frequency divisors there, not the scaling's parameters), and what llama.cpp fixes
by architecture rather than storing (Gemma 3's window pattern and attention scale, see
its declaration's `gguf_config`).

transformers' GGUF config mapping misses some of these (Qwen3's head_dim, Llama 3's
scaling): a checkpoint converted from safetensors must compute what the original
computes, so the file's own metadata decides here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worker_svc.models.architectures import architecture_for
from worker_svc.models.checkpoint.gguf_index import GgufIndex, read_index
from worker_svc.models.config_file import ConfigFile
from worker_svc.models.declaration import Architecture

GGML_F32 = 0


def read_gguf_config(path: Path) -> tuple[ConfigFile, Architecture] | None:
    """The file's config and its declared architecture, or None where no own forward
    covers its `general.architecture` (transformers then reads it)."""
    index = read_index(path)
    meta = index.metadata
    arch_name = str(meta.get("general.architecture"))
    architecture = architecture_for(None, arch_name)
    if meta.get(f"{arch_name}.expert_count"):
        # llama.cpp writes Mixtral as "llama" with experts: the family with experts.
        architecture = architecture_for(None, f"{arch_name}+experts") or architecture
    if architecture is None:
        return None

    def get(key: str, default=None):
        value = meta.get(f"{arch_name}.{key}")
        return default if value is None else value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    embed = index.tensors["token_embd.weight"]
    values = {
        **architecture.config_defaults,
        "architectures": [architecture.hf_architectures[0]],
        "model_type": architecture.model_types[0],
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(get("context_length")),
        # Stored as float32: 1e-6 reads back as 9.9999997e-07, the value llama.cpp uses.
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(embed.shape[1]),  # GGUF lists the innermost dimension first
        "tie_word_embeddings": "output.weight" not in index.tensors,
        "rope_parameters": _rope(index, get),
        "sliding_window": get("attention.sliding_window"),
    }
    if architecture.gguf_config is not None:
        architecture.gguf_config(values, get)
    return ConfigFile(values), architecture


def _rope(index: GgufIndex, get) -> dict:
    params: dict = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
    scaling = get("rope.scaling.type")
    if scaling == "linear":
        params.update(rope_type="linear", factor=float(get("rope.scaling.factor")))
    elif scaling not in (None, "none"):
        params["rope_type"] = str(scaling)  # refused by name when the spec is read
    freqs = index.tensors.get("rope_freqs.weight")
    if freqs is not None:
        if freqs.ggml_type != GGML_F32:
            raise ValueError("rope_freqs.weight is not float32")
        count = int(np.prod(freqs.shape))
        divisors = np.frombuffer(index.raw(freqs, 4 * count).tobytes(), dtype=np.float32)
        params.update(rope_type="factors", factors=tuple(float(f) for f in divisors))
    return params
