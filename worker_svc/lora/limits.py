"""The worker's LoRA limits, torch-free: worker_svc/config.py builds them at flag time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoraLimits:
    """The worker's --max-cpu-loras, --max-loras and --max-lora-rank."""

    max_cpu_loras: int  # adapters held loaded: slots 1..max_cpu_loras
    max_loras: int  # distinct adapters in one step
    max_lora_rank: int

    def __post_init__(self) -> None:
        for name in ("max_cpu_loras", "max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.max_loras > self.max_cpu_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least "
                f"max_loras ({self.max_loras}): a step's adapters must all be loaded"
            )
