"""Checkpoint tensors under transformers' names, from a Hugging Face directory
(safetensors) or straight from a GGUF file (read with the `gguf` package).

A GGUF model needs no conversion step: its quantized blocks are dequantized to
float32 here, so the float32 weights are exactly the values llama.cpp computes
with, and a quantized compute path then requantizes them its own way. The names and
the q/k row order come from the architecture's declaration (`gguf_names`,
`gguf_permutes_qk`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from worker_svc.models.declaration import Architecture

_LAYER = re.compile(r"^blk\.(\d+)\.")


def load_state_dict(
    checkpoint: Path, architecture: Architecture, num_heads: int, num_kv_heads: int
) -> dict[str, torch.Tensor]:
    if checkpoint.suffix == ".gguf":
        return _from_gguf(checkpoint, architecture, num_heads, num_kv_heads)
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


def gguf_to_hf_names(architecture: Architecture) -> dict[str, tuple[str, str]]:
    """llama.cpp's name template -> (transformers' name template, role)."""
    return {
        gguf: (architecture.hf_names[role], role)
        for role, gguf in architecture.gguf_names.items()
        if role in architecture.hf_names
    }


def hf_name(gguf_name: str, table: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """(transformers' name, role) of a GGUF tensor, or None for one the forward skips."""
    match = _LAYER.match(gguf_name)
    key = _LAYER.sub("blk.{i}.", gguf_name) if match else gguf_name
    found = table.get(key)
    if found is None:
        return None
    template, role = found
    return (template.format(i=match.group(1)) if match else template), role


def undo_rope_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter reorders each head's rows of q/k from transformers' rotate-half
    layout to interleaved pairs (llama only); this is the inverse, as transformers' GGUF
    loader does. Biases (1-D) are reordered the same way."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def qk_heads(architecture: Architecture, role: str, num_heads: int, num_kv_heads: int) -> int:
    """How many heads to un-permute a tensor of `role` by, 0 where nothing is to undo."""
    if not architecture.gguf_permutes_qk:
        return 0
    return {"q": num_heads, "q_bias": num_heads, "k": num_kv_heads, "k_bias": num_kv_heads}.get(
        role, 0
    )


def _from_gguf(
    checkpoint: Path, architecture: Architecture, num_heads: int, num_kv_heads: int
) -> dict[str, torch.Tensor]:
    import gguf

    reader = gguf.GGUFReader(str(checkpoint))
    table = gguf_to_hf_names(architecture)
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        named = hf_name(tensor.name, table)
        if named is None:
            continue
        name, role = named
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # GGUF lists dimensions innermost first; the array is already row-major.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = torch.from_numpy(values.reshape(shape).astype("float32"))
        heads = qk_heads(architecture, role, num_heads, num_kv_heads)
        state[name] = undo_rope_permute(weight, heads) if heads else weight
    return state
