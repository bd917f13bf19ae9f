"""The LoRA delta the decoder layers add after each fused projection, and how a model
gets its slot store.

One step's rows are grouped by adapter (LoraBatch.groups); each group costs two small
float32 matmuls per projection, `(x[rows] @ a[s].T) @ b[s]`, added into the
projection's output rows (the segmented gather-matmul of Punica / S-LoRA, one
segment per adapter). Base rows are in no group and cost nothing; a step of base rows
only skips it all. The delta is float32 whatever the activations are (the block path's
base stays in its blocks), rounded once to the activation dtype when added.
"""

from __future__ import annotations

import torch

from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.limits import LoraLimits
from worker_svc.lora.slots import PROJECTIONS, LoraSlots

# A layer's slot tensors by fused projection name: {"qkv": (a, b), ...}.
LayerLora = dict[str, tuple[torch.Tensor, torch.Tensor]]


def add_lora_delta(
    out: torch.Tensor,
    x: torch.Tensor,
    tensors: tuple[torch.Tensor, torch.Tensor],
    batch: LoraBatch,
) -> torch.Tensor:
    """out `[T, out]` += each row's adapter delta of x `[T, in]`, in place; returns out.

    A group whose rows are one run is read and added as views (float32: the second
    matmul adds into out itself); scattered rows are gathered and added back by index.
    """
    a, b = tensors
    for (slot, rows), span in zip(batch.groups, batch.spans, strict=True):
        if span is not None:
            rows_x, target = x[span[0] : span[1]], out[span[0] : span[1]]
        else:
            rows_x, target = x.index_select(0, rows), None
        shrunk = rows_x.float() @ a[slot].T
        if target is not None and target.dtype == torch.float32:
            target.addmm_(shrunk, b[slot])
            continue
        delta = (shrunk @ b[slot]).to(out.dtype)
        if target is not None:
            target.add_(delta)
        else:
            out.index_add_(0, rows, delta)
    return out


def attach_slots(model: torch.nn.Module, slots: LoraSlots) -> None:
    """Hands each decoder layer its projections' slot tensors (DecoderLayer.lora)."""
    own = getattr(model, "model", model)  # a CompiledForward wraps the own model
    for index, layer in enumerate(own.layers):
        layer.lora = {
            name: slots.tensors(index, name) for name in PROJECTIONS if slots.has(index, name)
        }


def build_slots(loaded, limits: LoraLimits) -> LoraSlots:
    """The slot store of a loaded model, attached to its layers; ValueError with the
    reason where the model's forward cannot add the delta."""
    own = getattr(loaded.model, "model", loaded.model)
    spec = getattr(own, "spec", None)
    if loaded.model_impl != "cbserve" or spec is None:
        raise ValueError(
            "--enable-lora needs the own forward (--model-impl cbserve or auto on a declared "
            f"architecture); this model runs on {loaded.model_impl!r}'s modules"
        )
    slots = LoraSlots(spec, limits, loaded.device)
    attach_slots(loaded.model, slots)
    return slots
