"""Requests spread over LoRA adapters: `cbserve bench --lora-modules a b c d`.

As `vllm bench serve` does, each request names one of the adapters as its model
(gRPC `lora_name`, HTTP `model`), chosen at random (the default, seeded by --seed) or
round-robin; no request of such a run goes to the base. An entry may be NAME=PATH
(a PEFT directory): a local stack the benchmark starts then loads it at start
(`--enable-lora --lora-modules NAME=PATH`); against --server or --base-url only the
names are used, and the server must already serve them.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass

from bench.harness.workload import BenchRequest

ASSIGNMENTS = ("random", "round-robin")


@dataclass(frozen=True)
class LoraModules:
    """The parsed --lora-modules: each adapter's name, and its path where given."""

    names: tuple[str, ...]
    paths: dict[str, str]

    def __post_init__(self) -> None:
        repeated = sorted({name for name in self.names if self.names.count(name) > 1})
        if repeated:
            raise ValueError(f"--lora-modules names an adapter twice: {', '.join(repeated)}")

    @classmethod
    def parse(cls, entries: list[str]) -> LoraModules:
        names: list[str] = []
        paths: dict[str, str] = {}
        for entry in entries:
            name, equals, path = entry.partition("=")
            name, path = name.strip(), path.strip()
            if not name or (equals and not path):
                raise ValueError(f"--lora-modules takes NAME or NAME=PATH, got {entry!r}")
            names.append(name)
            if path:
                paths[name] = path
        return cls(tuple(names), paths)

    def stack_args(self) -> tuple[list[str], list[str]]:
        """Worker and scheduler flags of a local stack serving these adapters: every
        adapter may run in one step (the run measures batching across adapters, not
        waiting for a slot); --worker-args and --scheduler-args given after them win."""
        if not self.paths:
            return [], []
        count = str(len(self.names))
        limits = ["--enable-lora", "--max-loras", count, "--max-cpu-loras", count]
        modules = ["--lora-modules", *(f"{name}={path}" for name, path in self.paths.items())]
        return limits, limits + modules


def assign(
    requests: list[BenchRequest], names: tuple[str, ...], strategy: str, seed: int
) -> list[BenchRequest]:
    """The requests, each naming one adapter of `names` (unchanged when there are none)."""
    if strategy not in ASSIGNMENTS:
        raise ValueError(f"--lora-assignment must be one of {ASSIGNMENTS}, got {strategy!r}")
    if not names:
        return list(requests)
    # A stream of its own, so that the workload's prompts and seeds do not move.
    rng = random.Random(f"lora-assignment-{seed}")
    assigned = []
    for position, request in enumerate(requests):
        name = names[position % len(names)] if strategy == "round-robin" else rng.choice(names)
        assigned.append(dataclasses.replace(request, lora_name=name))
    return assigned


def on_base(requests: list[BenchRequest]) -> list[BenchRequest]:
    """The same requests naming no adapter (--lora-beside-base's column)."""
    return [dataclasses.replace(request, lora_name="") for request in requests]


def describe(requests: list[BenchRequest], strategy: str) -> dict:
    """What results.json records: the adapters and how many requests named each."""
    counts = Counter(request.lora_name for request in requests if request.lora_name)
    if not counts:
        return {}
    return {
        "lora_assignment": strategy,
        "lora_requests": dict(sorted(counts.items())),
    }
