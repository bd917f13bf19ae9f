"""The LoRA delta the decoder layers add after each fused projection, and how a model
gets its slot store.

One step's rows are grouped by adapter (LoraBatch.groups); each group costs two small
float32 matmuls per projection, `(x[rows] @ a[s].T) @ b[s]`, added into the
projection's output rows (the segmented gather-matmul of Punica / S-LoRA, one
segment per adapter). Base rows are in no group and cost nothing; a step of base rows
only skips it all. The delta is float32 whatever the activations are (the block path's
base stays in its blocks), rounded once to the activation dtype when added; a bfloat16
store (lora/slots.py) is upcast as it is read. A projection of one part reads only the
rows its adapter's rank fills; a fused one (qkv, gate_up) reads its parts' padding too,
as one matmul over the parts costs less than one per part.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.limits import LoraLimits
from worker_svc.lora.slots import PROJECTIONS, LoraSlots, store_dtype


class SlotTensors(NamedTuple):
    """One fused projection's slot tensors (LoraSlots.tensors), its number of parts and
    the store they belong to (whose per-slot ranks a step reads)."""

    a: torch.Tensor
    b: torch.Tensor
    parts: int
    store: LoraSlots


# A layer's slot tensors by fused projection name: {"qkv": SlotTensors, ...}.
LayerLora = dict[str, SlotTensors]


def add_lora_delta(
    out: torch.Tensor,
    x: torch.Tensor,
    tensors: SlotTensors | tuple[torch.Tensor, torch.Tensor],
    batch: LoraBatch,
) -> torch.Tensor:
    """out `[T, out]` += each row's adapter delta of x `[T, in]`, in place; returns out.

    A group whose rows are one run is read and added as views (float32: the second
    matmul adds into out itself); scattered rows are gathered and added back by index.
    """
    for (slot, rows), span in zip(batch.groups, batch.spans, strict=True):
        if span is not None:
            rows_x, target = x[span[0] : span[1]], out[span[0] : span[1]]
        else:
            rows_x, target = x.index_select(0, rows), None
        a, b = _read(tensors, slot)
        shrunk = rows_x.float() @ a.T
        if target is not None and target.dtype == torch.float32:
            target.addmm_(shrunk, b)
            continue
        delta = (shrunk @ b).to(out.dtype)
        if target is not None:
            target.add_(delta)
        else:
            out.index_add_(0, rows, delta)
    return out


def _read(tensors, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot `slot`'s a `[R', in]` and b `[R', out]` in float32: its rank's rows only
    where the projection has one part, all of them (padding included) otherwise or for
    a plain (a, b) pair of a store (LoraSlots.tensors)."""
    a, b = tensors[0][slot], tensors[1][slot]
    if isinstance(tensors, SlotTensors) and tensors.parts == 1:
        rank = tensors.store.rank_list[slot]
        a, b = a[:rank], b[:rank]
    return a.float(), b.float()  # views where the store is float32


def attach_slots(model: torch.nn.Module, slots: LoraSlots) -> None:
    """Hands each decoder layer its projections' slot tensors (DecoderLayer.lora)."""
    own = getattr(model, "model", model)  # a CompiledForward wraps the own model
    for index, layer in enumerate(own.layers):
        layer.lora = {
            name: SlotTensors(
                *slots.tensors(index, name),
                len(slots.shapes[(index, name)].part_sizes),
                slots,
            )
            for name in PROJECTIONS
            if slots.has(index, name)
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
    slots = LoraSlots(spec, limits, loaded.device, store_dtype(loaded.dtype))
    attach_slots(loaded.model, slots)
    return slots
