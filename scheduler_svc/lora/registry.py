"""The adapters a request may name: name -> AdapterInfo, owned by the core.

The registry reads a PEFT directory's adapter_config.json itself (JSON, no torch) so
that a bad adapter is refused at load with its reason, before any worker is asked;
the workers read the weights when the core first places a request of the adapter on
them (core/adapter_residency.py). lora_id counts from 1 and is never reused in a
process, so a KV block or an event keyed by it never meets another adapter's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import grpc

from common.errors import ServiceError
from scheduler_svc.config.lora import LoraConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    # vLLM's lora_int_id: 1, 2, ... in the order adapters were loaded.
    lora_id: int
    path: str
    # The model it was trained on; the served model's name when none was given.
    base_model_name: str
    rank: int
    # PEFT's module names ("q_proj", "down_proj", ...), sorted.
    target_modules: tuple[str, ...]


def _not_found(message: str) -> ServiceError:
    return ServiceError(message, grpc.StatusCode.NOT_FOUND)


def _invalid(message: str) -> ServiceError:
    return ServiceError(message, grpc.StatusCode.INVALID_ARGUMENT)


def read_adapter_config(path: str, max_lora_rank: int) -> tuple[int, tuple[str, ...]]:
    """(rank, target modules) of the PEFT LoRA directory at path; ServiceError NOT_FOUND
    for a missing directory, INVALID_ARGUMENT for one that is not a usable LoRA adapter."""
    try:
        directory = Path(path).expanduser()
    except RuntimeError:
        # `~user/...` of a user this host does not know: no such directory here.
        raise _not_found(f"LoRA adapter directory {path!r} does not exist") from None
    if not directory.is_dir():
        raise _not_found(f"LoRA adapter directory {path!r} does not exist")
    config_path = directory / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise _invalid(f"{path!r} has no {CONFIG_FILE}: not a PEFT adapter directory") from None
    except (OSError, ValueError) as exc:
        raise _invalid(f"{config_path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _invalid(f"{config_path} is not a JSON object")
    if not (directory / WEIGHTS_FILE).is_file():
        raise _invalid(f"{path!r} has no {WEIGHTS_FILE} (the adapter's weights)")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise _invalid(f"{path!r} is a {peft_type or 'untyped'} adapter; only LORA is served")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _invalid(f"{config_path}: r must be a positive integer, got {rank!r}")
    if rank > max_lora_rank:
        raise _invalid(
            f"adapter {path!r} has rank {rank}, over --max-lora-rank {max_lora_rank}; "
            "start the scheduler and workers with a larger --max-lora-rank"
        )
    targets = config.get("target_modules")
    if isinstance(targets, str):
        # PEFT takes a regex here too; the worker resolves it against the model.
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise _invalid(f"{config_path}: target_modules must name the modules the adapter changes")
    return rank, tuple(sorted(set(targets)))


class AdapterRegistry:
    """name -> AdapterInfo; load and unload raise ServiceError for the client."""

    def __init__(self, max_lora_rank: int, served_model_name: str) -> None:
        self.max_lora_rank = max_lora_rank
        self.served_model_name = served_model_name
        self._adapters: dict[str, AdapterInfo] = {}
        self._last_id = 0

    @classmethod
    def from_config(cls, config: LoraConfig, served_model_name: str) -> AdapterRegistry:
        """With the --lora-modules loaded; ServiceError names the first bad one."""
        registry = cls(config.max_lora_rank, served_model_name)
        for module in config.modules:
            registry.load(module.name, module.path, module.base_model_name)
        return registry

    def load(self, name: str, path: str, base_model_name: str | None = None) -> AdapterInfo:
        if not name or name != name.strip() or any(char.isspace() for char in name):
            raise _invalid(f"lora_name must be non-empty without spaces, got {name!r}")
        if name == self.served_model_name:
            raise _invalid(f"lora_name {name!r} is the served model's own name")
        if name in self._adapters:
            raise _invalid(
                f"LoRA adapter {name!r} is already loaded (from "
                f"{self._adapters[name].path}); unload it first to replace it"
            )
        if not path:
            raise _invalid("lora_path must name a PEFT adapter directory")
        rank, targets = read_adapter_config(path, self.max_lora_rank)
        self._last_id += 1
        info = AdapterInfo(
            name=name,
            lora_id=self._last_id,
            path=str(Path(path).expanduser().resolve()),
            base_model_name=base_model_name or self.served_model_name,
            rank=rank,
            target_modules=targets,
        )
        self._adapters[name] = info
        return info

    def unload(self, name: str) -> AdapterInfo:
        """Forgets the adapter: requests naming it from now on are NOT_FOUND."""
        info = self._adapters.pop(name, None)
        if info is None:
            raise _not_found(f"LoRA adapter {name!r} is not loaded")
        return info

    def get(self, name: str) -> AdapterInfo:
        info = self._adapters.get(name)
        if info is None:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise _not_found(f"LoRA adapter {name!r} is not loaded (loaded: {known})")
        return info

    def adapters(self) -> list[AdapterInfo]:
        """Every loaded adapter, sorted by name."""
        return [self._adapters[name] for name in sorted(self._adapters)]

    def __len__(self) -> int:
        return len(self._adapters)
