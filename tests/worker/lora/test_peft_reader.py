"""Adapters the worker refuses at load, each with a reason a person can act on.

The directories are written by hand in PEFT's layout (adapter_config.json and
adapter_model.safetensors) against the default model's shapes, without its weights.
The checks of adapter_config.json come before any tensor is read (the fast tier); those
of the tensors open a safetensors file, which the fast tier keeps out (`model`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.worker.lora.specs import HIDDEN, INTER, NUM_LAYERS, smollm_spec
from worker_svc.errors import AdapterError, AdapterNotFoundError
from worker_svc.lora.peft_reader import read_peft_adapter
from worker_svc.lora.slots import LoraLimits, LoraSlots

PREFIX = "base_model.model.model.layers"


@pytest.fixture(scope="module")
def slots() -> LoraSlots:
    return LoraSlots(smollm_spec(), LoraLimits(max_cpu_loras=2, max_loras=1, max_lora_rank=8))


def write_adapter(directory: Path, tensors=None, **config) -> Path:
    """A PEFT directory of rank 4 on q_proj and down_proj of layer 0, unless told."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                "target_modules": ["q_proj", "down_proj"], **config}  # fmt: skip
    (directory / "adapter_config.json").write_text(json.dumps(settings))
    if tensors is None:
        r = settings["r"]
        tensors = {
            f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.randn(r, HIDDEN),
            f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.randn(HIDDEN, r),
            f"{PREFIX}.0.mlp.down_proj.lora_A.weight": torch.randn(r, INTER),
            f"{PREFIX}.0.mlp.down_proj.lora_B.weight": torch.randn(HIDDEN, r),
        }
    from safetensors.torch import save_file

    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def refused(directory: Path, slots: LoraSlots) -> str:
    with pytest.raises(AdapterError) as caught:
        read_peft_adapter(str(directory), slots)
    return str(caught.value)


def test_a_missing_directory_is_not_found(tmp_path, slots):
    with pytest.raises(AdapterNotFoundError, match="no LoRA adapter directory"):
        read_peft_adapter(str(tmp_path / "nowhere"), slots)
    with pytest.raises(AdapterNotFoundError):
        read_peft_adapter("", slots)


def test_config_refusals_name_the_reason(tmp_path, slots):
    cases = {
        "rank 16 is over this worker's --max-lora-rank 8": {"r": 16},
        "peft_type 'IA3' is not served": {"peft_type": "IA3"},
        "DoRA": {"use_dora": True},
        "target modules ['lm_head']": {"target_modules": ["q_proj", "lm_head"]},
        "target modules ['embed_tokens']": {"target_modules": ["embed_tokens"]},
        "save whole modules": {"modules_to_save": ["lm_head"]},
        "per-module ranks": {"rank_pattern": {"q_proj": 2}},
    }
    for index, (reason, config) in enumerate(cases.items()):
        directory = tmp_path / str(index)
        directory.mkdir()
        settings = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, **config}
        (directory / "adapter_config.json").write_text(json.dumps(settings))
        assert reason in refused(directory, slots)
    (tmp_path / "empty").mkdir()
    assert "adapter_config.json is missing" in refused(tmp_path / "empty", slots)


@pytest.mark.model  # opens a safetensors file
def test_reads_a_good_adapter(tmp_path, slots):
    adapter = read_peft_adapter(str(write_adapter(tmp_path / "ok", use_rslora=True)), slots)
    assert adapter.rank == 4 and adapter.scaling == pytest.approx(8 / 2)
    assert adapter.target_modules == ("down_proj", "q_proj")
    assert set(adapter.weights) == {(0, "q_proj"), (0, "down_proj")}


@pytest.mark.model  # opens safetensors files
def test_tensor_refusals_name_the_reason(tmp_path, slots):
    a, b = torch.randn(4, HIDDEN), torch.randn(HIDDEN, 4)
    head = {"base_model.model.lm_head.lora_A.weight": a,
            "base_model.model.lm_head.lora_B.weight": b}  # fmt: skip
    assert "'lm_head' is not a target" in refused(write_adapter(tmp_path / "h", head), slots)
    far = {f"{PREFIX}.{NUM_LAYERS}.self_attn.q_proj.lora_A.weight": a,
           f"{PREFIX}.{NUM_LAYERS}.self_attn.q_proj.lora_B.weight": b}  # fmt: skip
    assert "layer 30 is past this model's 30" in refused(write_adapter(tmp_path / "l", far), slots)
    wide = {f"{PREFIX}.2.self_attn.q_proj.lora_A.weight": torch.randn(4, HIDDEN + 64),
            f"{PREFIX}.2.self_attn.q_proj.lora_B.weight": b}  # fmt: skip
    reason = refused(write_adapter(tmp_path / "w", wide), slots)
    assert "do not fit this model" in reason and "another base model" in reason
    half = {f"{PREFIX}.2.self_attn.v_proj.lora_A.weight": a}
    assert "not both" in refused(write_adapter(tmp_path / "b", half), slots)


@pytest.mark.model  # opens a safetensors file
def test_an_mlp_target_of_a_mixture_layer_is_refused(tmp_path):
    mixture = LoraSlots(smollm_spec(2, sparse_layers=frozenset({0})), LoraLimits(1, 1, 8))
    reason = refused(write_adapter(tmp_path / "moe"), mixture)
    assert "layer 0 is a mixture of experts" in reason
