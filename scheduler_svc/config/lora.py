"""LoRA adapters: the scheduler's limits and the adapters it starts with, vLLM's flags.

    --enable-lora --max-loras 2 --max-lora-rank 16 --max-cpu-loras 4
    --lora-modules sql=/adapters/sql '{"name": "chat", "path": "/adapters/chat",
                                        "base_model_name": "SmolLM2-135M-Instruct"}'

`--max-loras` is the most distinct adapters in one step (the base does not count),
`--max-cpu-loras` how many a worker keeps loaded (its slots), at least `--max-loras`;
a worker's own limits (WorkerDescription) lower them for that worker. The modules are
only parsed here; their directories are read by the registry (scheduler_svc/lora/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_MODULE_KEYS = {"name", "path", "base_model_name"}


@dataclass(frozen=True)
class LoraModule:
    """One `--lora-modules` entry; base_model_name None: the served model's."""

    name: str
    path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.strip() or any(c.isspace() for c in self.name):
            raise ValueError(
                f"lora_modules: an adapter name must be non-empty without spaces, got {self.name!r}"
            )
        if not self.path.strip():
            raise ValueError(f"lora_modules: adapter {self.name!r} has an empty path")


@dataclass(frozen=True)
class LoraConfig:
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1
    modules: tuple[LoraModule, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                f"({self.max_loras}): a step's adapters must all be loaded at once"
            )
        names = [module.name for module in self.modules]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"lora_modules: names given twice: {', '.join(repeated)}")


def parse_lora_module(text: str) -> LoraModule:
    """`name=path` or vLLM's JSON object `{"name", "path", "base_model_name"}`."""
    text = text.strip()
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"lora_modules: {text!r} is not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"lora_modules: {text!r} must be a JSON object")
        unknown = sorted(fields.keys() - _MODULE_KEYS)
        missing = sorted({"name", "path"} - fields.keys())
        if unknown or missing:
            raise ValueError(
                f"lora_modules: {text!r} needs the keys name and path (and may give "
                f"base_model_name); unknown: {unknown}, missing: {missing}"
            )
        if not all(isinstance(value, str) for value in fields.values()):
            raise ValueError(f"lora_modules: {text!r}: every value must be a string")
        return LoraModule(fields["name"], fields["path"], fields.get("base_model_name"))
    name, equals, path = text.partition("=")
    if not equals:
        raise ValueError(
            f"lora_modules: {text!r} must be name=path or a JSON object "
            '{"name": ..., "path": ..., "base_model_name": ...}'
        )
    return LoraModule(name.strip(), path.strip())


def split_lora_modules(text: str) -> list[str]:
    """The entries of one flag text: commas split `a=/x,b=/y`, but not inside a JSON
    object (how a variable holds several entries of either form)."""
    pieces, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(text[start:index])
            start = index + 1
    pieces.append(text[start:])
    return pieces


def lora_config(
    *,
    enable_lora: bool,
    lora_modules: list[str],
    max_loras: int,
    max_lora_rank: int,
    max_cpu_loras: int | None,
) -> LoraConfig | None:
    """The flags as a LoraConfig; None with LoRA off (then no module may be given).
    The limits are checked either way, so that a bad one fails at start."""
    if lora_modules and not enable_lora:
        raise ValueError("lora_modules needs enable_lora (--enable-lora)")
    modules = tuple(parse_lora_module(text) for text in lora_modules)
    cpu_loras = max_loras if max_cpu_loras is None else max_cpu_loras
    config = LoraConfig(max_loras, max_lora_rank, cpu_loras, modules)
    return config if enable_lora else None
