"""A GGUF's projection and head weights as their own quantized blocks (not
dequantized), fused and reordered as the own forward uses them, named by the
architecture's declaration.

Rows of a block format are independent (blocks run along K), so the fused QKV and
gate/up are the byte rows of their parts stacked, and the rotary reordering of q and
k (checkpoint.weights.undo_rope_permute, llama only) is a permutation of byte rows.
Q4_1, Q8_0, Q4_K, Q5_K, Q6_K and Q5_0 tensors (what llama.cpp's Q4_K_M and its kin
hold), F16 and BF16 ones (a converter's --outtype f16 / bf16) and MXFP4 ones (gpt-oss's
experts) are kept as the file stores them; tensors in a format the kernel has no code for
are read dequantized and requantized to Q8_0 at load. A fused weight whose parts the
file stores in different formats (a Q4_K_M file's Q6_K attn_v beside Q4_K q and k) is
kept as runs of rows, one per format (compute/qblock_stack.py), so that it too
computes with the file's own weights.

Which GGUF belongs to a converted float directory is checked, not assumed: its
dequantized blocks must equal the directory's float32 weights bit for bit
(`blocks_match_state`), else the model is treated as float-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from worker_svc.compute.qblock import FORMATS, Q8_0, BlockFormat, dequantize, quantize
from worker_svc.models.checkpoint.gguf_index import GgufIndex, TensorInfo, read_index
from worker_svc.models.checkpoint.weights import undo_rope_permute
from worker_svc.models.declaration import Architecture

# One weight as the kernel takes it: (blocks [N, bytes], format, K).
Blocks = tuple[torch.Tensor, BlockFormat, int]

# The fused projections of the own forward, by the roles of their parts.
_PARTS = {
    "qkv": ("q", "k", "v"),
    "o": ("o",),
    "gate_up": ("gate", "up"),
    "down": ("down",),
}


@dataclass
class GgufBlocks:
    num_layers: int
    # layer index -> {"qkv" | "o" | "gate_up" | "down": its runs of rows, each one
    # format; a single run unless the fused parts are stored in different formats}
    layers: dict[int, dict[str, list[Blocks]]] = field(default_factory=dict)
    lm_head: Blocks | None = None
    embedding: Blocks | None = None
    # transformers' weight name -> the blocks before fusing (for blocks_match_state).
    parts: dict[str, Blocks] = field(default_factory=dict)


# ggml's type ids of the formats the kernel reads (gguf.GGMLQuantizationType).
_GGML_TYPES = {
    3: "Q4_1",
    8: "Q8_0",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    6: "Q5_0",
    1: "F16",  # llama.cpp's converter with --outtype f16
    30: "BF16",  # and with --outtype bf16
    39: "MXFP4",  # gpt-oss's experts (its released files, llama-quantize's MXFP4_MOE)
}


def _tensor_blocks(index: GgufIndex, info: TensorInfo) -> Blocks:
    k = info.shape[0]  # GGUF lists the innermost dimension first
    n = int(np.prod(info.shape[1:]))
    fmt = FORMATS.get(_GGML_TYPES.get(info.ggml_type, ""))
    if fmt is not None and k % fmt.block_weights == 0:
        # Copied out of the memory map, so that the file's pages are not kept resident.
        raw = np.array(index.raw(info, n * fmt.row_bytes(k)))
        return torch.from_numpy(raw.reshape(n, -1)), fmt, k
    import gguf

    kind = gguf.GGMLQuantizationType(info.ggml_type)
    block, size = gguf.constants.GGML_QUANT_SIZES[kind]
    raw = index.raw(info, n * k // block * size).reshape(n, -1)
    values = np.asarray(gguf.quants.dequantize(raw, kind), dtype=np.float32).reshape(n, k)
    return quantize(torch.from_numpy(values), Q8_0), Q8_0, k


def gguf_architecture(path: str | Path) -> str:
    """The file's `general.architecture` ("llama", "qwen3", ...)."""
    return str(read_index(path).metadata["general.architecture"])


def gguf_has_experts(path: str | Path) -> bool:
    """Whether the file's layers are mixtures (llama.cpp writes Mixtral as "llama")."""
    meta = read_index(path).metadata
    return bool(meta.get(f"{meta['general.architecture']}.expert_count"))


def read_gguf_blocks(path: str | Path, architecture: Architecture, layers=None) -> GgufBlocks:
    """All layers' projections (or only `layers`), the LM head and the embedding."""
    index = read_index(path)
    gguf_names, hf_names = architecture.gguf_names, architecture.hf_names
    meta, tensors = index.metadata, index.tensors
    arch = meta["general.architecture"]
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    num_layers = int(meta[f"{arch}.block_count"])
    out = GgufBlocks(num_layers=num_layers)
    for layer in layers if layers is not None else range(num_layers):
        fused = {}
        sparse = "experts_gate" in gguf_names and (
            gguf_names["experts_gate"].format(i=layer) in tensors
        )
        if sparse:
            fused.update(_expert_blocks(index, architecture, layer))
        for name, parts in _PARTS.items():
            if sparse and name in ("gate_up", "down"):
                continue
            pieces = []
            for part in parts:
                info = tensors[gguf_names[part].format(i=layer)]
                blocks, fmt, k = _tensor_blocks(index, info)
                if architecture.gguf_permutes_qk and part in ("q", "k"):
                    blocks = undo_rope_permute(blocks, heads if part == "q" else kv_heads)
                pieces.append((blocks, fmt, k))
            names = [hf_names[part].format(i=layer) for part in parts]
            fused[name] = _fuse(pieces, names, out.parts)
        out.parts.update(fused.pop("parts", {}))
        out.layers[layer] = fused
    out.embedding = _tensor_blocks(index, tensors[gguf_names["embed"]])
    head = tensors.get(gguf_names["lm_head"])
    out.lm_head = _tensor_blocks(index, head) if head is not None else out.embedding
    out.parts[hf_names["embed"]] = out.embedding
    if head is not None:
        out.parts[hf_names["lm_head"]] = out.lm_head
    return out


def _expert_blocks(index: GgufIndex, architecture: Architecture, layer: int) -> dict:
    """A mixture layer's stacked `*_exps` tensors, one weight per expert: rows
    e * out .. (e + 1) * out of the 3-D tensor are expert e's; and a shared expert's
    2-D ones. Each expert's parts are recorded under its name in a float checkpoint
    (for blocks_match_state)."""
    gguf_names, hf_names = architecture.gguf_names, architecture.hf_names
    stacked = {}
    for part in ("gate", "up", "down"):
        info = index.tensors[gguf_names[f"experts_{part}"].format(i=layer)]
        blocks, fmt, k = _tensor_blocks(index, info)
        experts = int(info.shape[2])
        out = blocks.shape[0] // experts
        stacked[part] = [(blocks[e * out : (e + 1) * out], fmt, k) for e in range(experts)]
    gate_up, down, parts = [], [], {}
    for e in range(len(stacked["gate"])):
        names = [_expert_name(hf_names, part, layer, e) for part in ("gate", "up")]
        gate_up.append(_fuse([stacked["gate"][e], stacked["up"][e]], names, parts))
        down.append([stacked["down"][e]])
        parts[_expert_name(hf_names, "down", layer, e)] = stacked["down"][e]
    blocks = {"experts_gate_up": gate_up, "experts_down": down, "parts": parts}
    if "shared_gate" in gguf_names:  # a shared expert: 2-D `ffn_*_shexp` tensors
        named = {
            part: _tensor_blocks(index, index.tensors[gguf_names[part].format(i=layer)])
            for part in ("shared_gate", "shared_up", "shared_down")
        }
        names = [hf_names[part].format(i=layer) for part in ("shared_gate", "shared_up")]
        blocks["shared_gate_up"] = _fuse([named["shared_gate"], named["shared_up"]], names, parts)
        blocks["shared_down"] = [named["shared_down"]]
        parts[hf_names["shared_down"].format(i=layer)] = named["shared_down"]
    return blocks


def _expert_name(hf_names: dict, part: str, layer: int, expert: int) -> str:
    """Expert `expert`'s `part` as a float checkpoint names it; a family that stores
    its experts fused (gpt-oss) gets a name of the stacked tensor's."""
    template = hf_names.get(f"expert_{part}") or hf_names[f"experts_{part}"] + ".{e}"
    return template.replace("{i}", str(layer)).replace("{e}", str(expert))


def _fuse(pieces: list[Blocks], names: list[str], parts: dict[str, Blocks]) -> list[Blocks]:
    """The pieces' rows as runs: neighbours of one format stacked into one weight, a new
    run where the format changes. Each piece is recorded in `parts` as a view of its
    run's rows (no second copy)."""
    groups: list[list[tuple[str, Blocks]]] = []
    for name, piece in zip(names, pieces, strict=True):
        if groups and groups[-1][0][1][1] is piece[1]:
            groups[-1].append((name, piece))
        else:
            groups.append([(name, piece)])
    runs = []
    for group in groups:
        # numpy's single-threaded copies: torch's 2-thread ones stall on a busy machine.
        stacked = torch.from_numpy(np.concatenate([b.numpy() for _, (b, _, _) in group]))
        rows = 0
        for name, (blocks, fmt, k) in group:
            parts[name] = (stacked[rows : rows + blocks.shape[0]], fmt, k)
            rows += blocks.shape[0]
        runs.append((stacked, group[0][1][1], group[0][1][2]))
    return runs


# Rows dequantized at a time when checking: a whole embedding would be another 113 MB.
_CHECK_ROWS = 4096


def blocks_match_state(blocks: GgufBlocks, state: dict[str, torch.Tensor]) -> str | None:
    """None when every weight's blocks dequantize to exactly the float32 tensor of the
    same name in `state`; else the first that does not (or is missing)."""
    for name, (data, fmt, _k) in blocks.parts.items():
        weight = state.get(name)
        if weight is None:
            return f"{name} is not in the float checkpoint"
        if weight.dtype != torch.float32 or weight.shape[0] != data.shape[0]:
            return f"{name} differs from the GGUF's dequantized {fmt.name} blocks"
        for start in range(0, data.shape[0], _CHECK_ROWS):
            rows = slice(start, start + _CHECK_ROWS)
            if not np.array_equal(dequantize(data[rows], fmt).numpy(), weight[rows].numpy()):
                return f"{name} differs from the GGUF's dequantized {fmt.name} blocks"
    return None
