"""PEFT LoRA adapters made at test time on the default model, with random A and B.

PEFT initializes B to zeros, so a fresh adapter changes nothing and a forward that
forgot the delta would pass; every lora_A and lora_B is filled with small random values
instead, enough to change the greedy replies while keeping them sane. Each adapter is
saved with save_pretrained, as a user's would be, and its PEFT model is kept as the
reference (transformers' generate through PEFT's own layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from common.defaults import default_model_path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_SEVEN = (*ATTENTION, "gate_proj", "up_proj", "down_proj")
SCALE = 0.03


@dataclass(frozen=True)
class AdapterCase:
    name: str
    rank: int
    targets: tuple[str, ...]
    alpha: int
    use_rslora: bool = False


# Two ranks times two target sets; one scales by alpha/sqrt(r) (rsLoRA).
CASES = (
    AdapterCase("r8-attention", 8, ATTENTION, alpha=16),
    AdapterCase("r16-attention", 16, ATTENTION, alpha=16, use_rslora=True),
    AdapterCase("r8-all", 8, ALL_SEVEN, alpha=8),
    AdapterCase("r16-all", 16, ALL_SEVEN, alpha=32),
)


def make_peft_adapter(case: AdapterCase, directory: Path, seed: int):
    """Saves the adapter into `directory`; returns its PEFT model (eval, float32)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32)
    config = LoraConfig(
        r=case.rank,
        lora_alpha=case.alpha,
        target_modules=list(case.targets),
        lora_dropout=0.0,
        use_rslora=case.use_rslora,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * SCALE)
    model.save_pretrained(directory)
    return model.eval()


def peft_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """PEFT-on-transformers' greedy continuation (stops at EOS)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt) :].tolist()
