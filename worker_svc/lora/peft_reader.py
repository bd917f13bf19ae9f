"""Reads a PEFT LoRA adapter directory and checks it against the served model.

A directory holds `adapter_config.json` and `adapter_model.safetensors`, whose tensors
are named after the module they change:

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

Everything that cannot be served is refused here, before any slot is touched, with a
reason a person can act on: another method than LoRA, DoRA, trained biases or whole
modules saved beside the adapter, a module the decoder's projections do not cover
(lm_head, embed_tokens, a mixture layer's experts), a layer past the model's, a shape
of another model, or a rank over --max-lora-rank.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from worker_svc.errors import AdapterError, AdapterNotFoundError
from worker_svc.lora.slots import MODULE_PARTS, LoraSlots

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_TENSOR = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_LAYER_MODULE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<name>\w+)$")


@dataclass(frozen=True)
class PeftAdapter:
    """An adapter checked against the model, ready for LoraSlots.write."""

    rank: int
    scaling: float  # alpha / r, or alpha / sqrt(r) with rsLoRA
    target_modules: tuple[str, ...]  # PEFT names: "q_proj", "down_proj", ...
    # (layer, PEFT module) -> (lora_A [r, in], lora_B [out_part, r]), float32
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def read_peft_adapter(path: str, slots: LoraSlots) -> PeftAdapter:
    """Raises AdapterNotFoundError (no directory) or AdapterError (with the reason)."""
    directory = Path(path)
    if not path or not directory.is_dir():
        raise AdapterNotFoundError(f"no LoRA adapter directory at {path!r}")
    config = _read_config(directory)
    rank, scaling = _check_config(config, slots.max_rank)
    tensors = _read_tensors(directory)
    weights = _pair_tensors(tensors, slots, rank)
    if not weights:
        raise AdapterError(f"{directory / WEIGHTS_FILE} holds no lora_A/lora_B tensors")
    modules = tuple(sorted({module for _, module in weights}))
    return PeftAdapter(rank, scaling, modules, weights)


def _read_config(directory: Path) -> dict:
    file = directory / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise AdapterError(f"{file} is missing: not a PEFT adapter directory") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{file} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{file} is not a JSON object")
    return config


def _check_config(config: dict, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a config this worker serves."""
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(f"peft_type {peft_type!r} is not served: only LORA adapters are")
    if config.get("use_dora"):
        raise AdapterError("DoRA adapters (use_dora) are not served: only plain LoRA")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"adapters that train biases (bias={config['bias']!r}) are not served")
    if config.get("modules_to_save"):
        raise AdapterError(
            f"adapters that save whole modules ({config['modules_to_save']}) are not served"
        )
    for pattern in ("rank_pattern", "alpha_pattern"):
        if config.get(pattern):
            raise AdapterError(f"per-module ranks or alphas ({pattern}) are not served")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"rank r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(
            f"rank {rank} is over this worker's --max-lora-rank {max_rank}: start it with "
            f"--max-lora-rank {rank} or more"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise AdapterError(f"lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(MODULE_PARTS))
        if unknown:
            raise AdapterError(
                f"target modules {unknown} are not projections of this model's decoder "
                f"layers: an adapter may target only {sorted(MODULE_PARTS)}"
            )
    return rank, scaling


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = directory / WEIGHTS_FILE
    if not file.is_file():
        other = " (adapter_model.bin is not read: save with safetensors)"
        raise AdapterError(
            f"{file} is missing{other if (directory / 'adapter_model.bin').exists() else ''}"
        )
    try:
        return load_file(str(file))
    except (OSError, SafetensorError) as exc:
        raise AdapterError(f"{file} cannot be read: {exc}") from None


def _pair_tensors(
    tensors: dict[str, torch.Tensor], slots: LoraSlots, rank: int
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, module) -> (A, B), each checked against the model's shapes."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR.match(name)
        if match is None:
            raise AdapterError(f"tensor {name!r} is not a LoRA A or B weight this worker serves")
        layer, module = _locate(match.group("module"), slots)
        halves.setdefault((layer, module), {})[match.group("which")] = tensor
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        where = f"layer {layer} {module}"
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{where} has lora_A or lora_B but not both")
        lora_a, lora_b = pair["A"].float(), pair["B"].float()
        fused, part = MODULE_PARTS[module]
        shape = slots.shapes[(layer, fused)]
        want_a = (rank, shape.in_features)
        want_b = (shape.part_sizes[part], rank)
        if tuple(lora_a.shape) != want_a or tuple(lora_b.shape) != want_b:
            raise AdapterError(
                f"{where}: lora_A {tuple(lora_a.shape)} and lora_B {tuple(lora_b.shape)} do "
                f"not fit this model, which needs {want_a} and {want_b} (rank {rank}): "
                "an adapter of another base model?"
            )
        weights[(layer, module)] = (lora_a, lora_b)
    return weights


def _locate(module_path: str, slots: LoraSlots) -> tuple[int, str]:
    """(layer, PEFT module name) of a tensor's module, or the reason it is not served."""
    match = _LAYER_MODULE.match(module_path)
    if match is None or match.group("name") not in MODULE_PARTS:
        raise AdapterError(
            f"module {module_path!r} is not a target this worker serves: an adapter may "
            f"change only {sorted(MODULE_PARTS)} of the decoder layers"
        )
    layer, name = int(match.group("layer")), match.group("name")
    if layer >= slots.num_layers:
        raise AdapterError(
            f"module {module_path!r}: layer {layer} is past this model's {slots.num_layers}"
        )
    if not slots.has(layer, MODULE_PARTS[name][0]):
        raise AdapterError(
            f"module {module_path!r}: layer {layer} is a mixture of experts, whose MLP is "
            "not a LoRA target here"
        )
    return layer, name
