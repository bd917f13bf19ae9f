"""The preallocated store of loaded LoRA adapters (the slot layout of issue 43's design).

Every fused projection of every decoder layer has two tensors, allocated once at start
for `max_cpu_loras + 1` slots (slot 0 is the base: zeros, never written):

    a: [slots, parts * max_lora_rank, in_features]
    b: [slots, parts * max_lora_rank, out_features]

so that the delta of a row under slot s is `(x @ a[s].T) @ b[s]`, one pair of
matmuls per fused projection whatever the adapter targets. Part p of a fused projection
(q, k, v of "qkv"; gate, up of "gate_up") owns rows `p*max_rank .. p*max_rank + r` of
`a` and of `b`, in `b` under its own output columns only (block-diagonal), so parts
never leak into each other. b is PEFT's lora_B transposed: the native decode step reads
a part's block as runs of contiguous output columns (kernels/decode_lora.h), where
[out, R] rows would have it fetch the other parts' zeros beside each row's few floats.
A part the adapter does not target, and the ranks past the adapter's own, stay zero.
The scaling (alpha/r, or alpha/sqrt(r) with rsLoRA) is folded into `b` at load, so the
step multiplies nothing else. Loading copies into a slot in place: nothing is allocated
per step or per load, and the native decode step reads the same tensors.

`ranks[slot]` is the rank of the adapter a slot holds (0: empty), so that a step reads
only the `r` rows of each part that an adapter below the store's max rank fills. The
store is float32, or bfloat16 under bfloat16 activations (`store_dtype`): half the
bytes a step reads per adapter, widened to float32 as they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from worker_svc.lora.limits import LoraLimits
from worker_svc.models.declaration import DecoderSpec

__all__ = [
    "MODULE_PARTS",
    "PROJECTIONS",
    "LoraLimits",
    "LoraSlots",
    "ProjectionShape",
    "store_dtype",
]

# The fused projections of a decoder layer, in the order a layer runs them.
PROJECTIONS = ("qkv", "o", "gate_up", "down")

# A PEFT target module -> (its fused projection, its part index in that projection).
MODULE_PARTS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}


@dataclass(frozen=True)
class ProjectionShape:
    """A fused projection's input width and the output rows of each of its parts."""

    in_features: int
    part_sizes: tuple[int, ...]  # q, k, v / gate, up / the one part

    @property
    def out_features(self) -> int:
        return sum(self.part_sizes)

    def part_offset(self, part: int) -> int:
        return sum(self.part_sizes[:part])


def store_dtype(activation_dtype: torch.dtype) -> torch.dtype:
    """The slot store's element type for a model whose activations are `activation_dtype`:
    bfloat16 where they are, so the store holds no less than the activations carry; else
    float32. The q4_1 block path's activations are float32, and there a bfloat16 store
    moved the native step's logits 1.1e-4 (relative to the largest) from the float32
    store's, ten times the step's tolerance against the Python forward, for 3-4% of a
    one-row step (measured on a Zen 4): its store stays float32."""
    return torch.bfloat16 if activation_dtype == torch.bfloat16 else torch.float32


def projection_shapes(spec: DecoderSpec, layer: int) -> dict[str, ProjectionShape]:
    """The LoRA-able projections of layer `layer`: a mixture layer has no dense MLP."""
    q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {
        "qkv": ProjectionShape(spec.hidden_size, (q_size, kv_size, kv_size)),
        "o": ProjectionShape(q_size, (spec.hidden_size,)),
    }
    if not spec.is_sparse(layer):
        inter = spec.intermediate_size
        shapes["gate_up"] = ProjectionShape(spec.hidden_size, (inter, inter))
        shapes["down"] = ProjectionShape(inter, (spec.hidden_size,))
    return shapes


class LoraSlots:
    """The slot store of one worker. `write` and `clear` must run between steps (the
    servicer takes the step lock): a step never reads a half-written slot."""

    def __init__(
        self,
        spec: DecoderSpec,
        limits: LoraLimits,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"a LoRA slot store is float32 or bfloat16, not {dtype}")
        self.limits = limits
        self.dtype = dtype
        self.max_rank = limits.max_lora_rank
        self.num_slots = limits.max_cpu_loras + 1
        self.num_layers = len(spec.layers)
        # (layer, name) -> shape; a projection a layer lacks has no entry.
        self.shapes: dict[tuple[int, str], ProjectionShape] = {}
        self._tensors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in range(self.num_layers):
            for name, shape in projection_shapes(spec, layer).items():
                width = len(shape.part_sizes) * self.max_rank
                made = {"device": device, "dtype": dtype}
                a = torch.zeros(self.num_slots, width, shape.in_features, **made)
                b = torch.zeros(self.num_slots, width, shape.out_features, **made)
                self.shapes[(layer, name)] = shape
                self._tensors[(layer, name)] = (a, b)
        # slot -> the PEFT modules it changes; an empty slot has no entry.
        self.loaded: dict[int, tuple[str, ...]] = {}
        # Each slot's adapter rank, 0 when empty: the rows of each part a step reads. In a
        # tensor (int32, on the CPU) that the native step reads in place.
        self.ranks = torch.zeros(self.num_slots, dtype=torch.int32)
        self.rank_list = [0] * self.num_slots  # the same, for the Python delta

    def has(self, layer: int, name: str) -> bool:
        return (layer, name) in self._tensors

    def tensors(self, layer: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(a `[slots, parts*R, in]`, b `[slots, parts*R, out]`) of one fused projection."""
        return self._tensors[(layer, name)]

    def is_loaded(self, slot: int) -> bool:
        return slot in self.loaded

    def check_slot(self, slot: int) -> None:
        if not 1 <= slot < self.num_slots:
            raise ValueError(
                f"slot {slot} is out of range: this worker's slots are 1..{self.num_slots - 1}"
            )

    def write(
        self,
        slot: int,
        weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
        scaling: float,
    ) -> None:
        """Write an adapter into `slot`, replacing what it held. `weights`: (layer, PEFT
        module) -> (lora_A `[r, in]`, lora_B `[out_part, r]`), already checked against
        `shapes` and the rank (lora/peft_reader.py)."""
        self.check_slot(slot)
        self.clear(slot)
        ranks = {lora_a.shape[0] for lora_a, _ in weights.values()}
        if len(ranks) > 1 or max(ranks, default=0) > self.max_rank:
            raise ValueError(f"an adapter has one rank up to {self.max_rank}, not {ranks}")
        for (layer, module), (lora_a, lora_b) in weights.items():
            name, part = MODULE_PARTS[module]
            shape = self.shapes[(layer, name)]
            a, b = self._tensors[(layer, name)]
            rank, first = lora_a.shape[0], part * self.max_rank
            rows = slice(shape.part_offset(part), shape.part_offset(part) + shape.part_sizes[part])
            a[slot, first : first + rank].copy_(lora_a)
            b[slot, first : first + rank, rows].copy_(lora_b.T.float() * scaling)
        self.loaded[slot] = tuple(sorted({module for _, module in weights}))
        self.ranks[slot] = self.rank_list[slot] = max(ranks, default=0)

    def clear(self, slot: int) -> None:
        """Zero `slot`: a row planned on it would compute the base."""
        self.check_slot(slot)
        for a, b in self._tensors.values():
            a[slot].zero_()
            b[slot].zero_()
        self.loaded.pop(slot, None)
        self.ranks[slot] = self.rank_list[slot] = 0

    def rank(self, slot: int) -> int:
        """The rows of each part that `slot`'s adapter fills (0: empty)."""
        return self.rank_list[slot]
