"""What a declaration varies by layer, as the native step's address tables
(kernels/decode_model.h's per-layer fields): each an int64 tensor of the addresses of a
layer's float32 tensors, 0 where the layer has none. The tensors themselves are the
model's (kept alive by it), except the float32 copies made here, which this object keeps.
"""

from __future__ import annotations

import torch


class LayerTables:
    """DecodeModel's per-layer fields for a block DecoderForCausalLM (native.py)."""

    def __init__(self, model):
        layers = model.layers
        self._kept: list[torch.Tensor] = []
        self.norms = _table([[layer.attn_norm.weight, layer.mlp_norm.weight] for layer in layers])
        rotaries = [model.rotaries[model.layer_rope[i]] for i in range(len(layers))]
        # The RotaryEmbedding's own buffers: a scaling's attention factor (YaRN's) is
        # already in them, as the Python forward reads them.
        self.rope_tables = _table([[rotary.cos, rotary.sin] for rotary in rotaries])
        self.windows = torch.tensor([layer.window or 0 for layer in layers], dtype=torch.int64)
        self.qkv_biases = _table([[self._float(layer.qkv_proj.bias)] for layer in layers])
        self.qk_norms = _table([[_weight(layer.q_norm), _weight(layer.k_norm)] for layer in layers])
        self.post_norms = _table(
            [[_weight(layer.attn_post_norm), _weight(layer.mlp_post_norm)] for layer in layers]
        )
        # gpt-oss: a sink logit per query head, and o_proj's bias (added before the
        # residual, and before a post-norm where a layer has one).
        self.sinks = _table([[self._float(getattr(layer, "sinks", None))] for layer in layers])
        self.o_biases = _table([[self._float(layer.o_proj.bias)] for layer in layers])

    def _float(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """The tensor as contiguous float32 (a copy kept here where it is not)."""
        if tensor is None or (tensor.dtype == torch.float32 and tensor.is_contiguous()):
            return tensor
        tensor = tensor.float().contiguous()
        self._kept.append(tensor)
        return tensor

    def fields(self) -> dict:
        """DecodeModel's fields: the tables' addresses."""
        names = ("norms", "rope_tables", "windows", "qkv_biases", "qk_norms", "post_norms")
        return {name: getattr(self, name).data_ptr() for name in (*names, "sinks", "o_biases")}


def _table(rows: list[list[torch.Tensor | None]]) -> torch.Tensor:
    """[layers] (one tensor a layer) or [layers][n] addresses, 0 for None."""
    table = torch.tensor(
        [[0 if t is None else t.data_ptr() for t in row] for row in rows], dtype=torch.int64
    )
    return table.squeeze(1) if table.shape[1] == 1 else table


def _weight(norm) -> torch.Tensor | None:
    return None if norm is None else norm.weight


# A layer's LoRA slot tensors by fused projection (lora/delta.py's DecoderLayer.lora), in
# decode_model.h's PROJ_* order, each with its number of parts.
LORA_PARTS = {"qkv": 3, "o": 1, "gate_up": 2, "down": 1}


class LoraTable:
    """DecodeModel's LoRA fields (kernels/decode_lora.h) for the slot tensors attached to
    a model's layers (lora/delta.py attach_slots): per layer and projection the addresses
    of a `[slots, parts * rank, in]` and b `[slots, parts * rank, out]` (float32 or
    bfloat16) and the store's per-slot ranks, all read in place, so that a load into a
    slot is seen by the next step. `source` is what it was built from."""

    def __init__(self, model):
        spec = model.spec
        self.source = [layer.lora for layer in model.layers]
        first = self.source[0]["qkv"]
        self.store = first.store  # its per-slot ranks, read in place
        self.rank, self.slots = first.a.shape[1] // 3, first.a.shape[0]
        self.dtype = first.a.dtype
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        hidden, inter = spec.hidden_size, spec.intermediate_size
        shapes = {  # (in, out) of each projection, as the step reads them
            "qkv": (hidden, q + 2 * kv),
            "o": (q, hidden),
            "gate_up": (hidden, 2 * inter),
            "down": (inter, hidden),
        }
        rows = []
        for index, lora in enumerate(self.source):
            row = []
            for name, parts in LORA_PARTS.items():
                if name not in lora:  # a mixture layer's MLP
                    row += [0, 0]
                    continue
                a, b = lora[name].a, lora[name].b
                width, (n_in, n_out) = parts * self.rank, shapes[name]
                expected = ((self.slots, width, n_in), (self.slots, width, n_out))
                for tensor, shape in zip((a, b), expected, strict=True):
                    if (
                        tuple(tensor.shape) != shape
                        or tensor.dtype not in (torch.float32, torch.bfloat16)
                        or tensor.dtype != self.dtype
                        or tensor.device.type != "cpu"
                        or not tensor.is_contiguous()
                    ):
                        raise ValueError(f"layer {index}'s {name} LoRA tensors: not {shape}")
                row += [a.data_ptr(), b.data_ptr()]
            rows.append(row)
        self.table = torch.tensor(rows, dtype=torch.int64)

    def fields(self) -> dict:
        return {
            "lora": self.table.data_ptr(),
            "lora_rank": self.rank,
            "lora_slots": self.slots,
            "lora_ranks": self.store.ranks.data_ptr(),
            "lora_bf16": int(self.dtype == torch.bfloat16),
        }
