"""Checkpoint tensors under transformers' names, from a Hugging Face directory
(safetensors) or straight from a GGUF file (read with the `gguf` package).

A GGUF model needs no conversion step: its quantized blocks are dequantized to
float32 here, so the float32 weights are exactly the values llama.cpp computes
with, and a quantized compute path then requantizes them its own way.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

# llama.cpp's tensor names -> transformers'. `{i}` is the layer index.
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def load_state_dict(checkpoint: Path, num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    if checkpoint.suffix == ".gguf":
        return _from_gguf(checkpoint, num_heads, num_kv_heads)
    return _from_safetensors(checkpoint)


def _from_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _hf_name(gguf_name: str) -> str | None:
    match = _LAYER.match(gguf_name)
    key = _LAYER.sub("blk.{i}.", gguf_name) if match else gguf_name
    template = _GGUF_NAMES.get(key)
    if template is None:
        return None
    return template.format(i=match.group(1)) if match else template


def _undo_rope_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter reorders each head's rows of q/k from transformers' rotate-half
    layout to interleaved pairs; this is the inverse, as transformers' GGUF loader does."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def _from_gguf(checkpoint: Path, num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    import gguf

    reader = gguf.GGUFReader(str(checkpoint))
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # GGUF lists dimensions innermost first; the array is already row-major.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = torch.from_numpy(values.reshape(shape).astype("float32"))
        if name.endswith("q_proj.weight"):
            weight = _undo_rope_permute(weight, num_heads)
        elif name.endswith("k_proj.weight"):
            weight = _undo_rope_permute(weight, num_kv_heads)
        state[name] = weight
    return state
