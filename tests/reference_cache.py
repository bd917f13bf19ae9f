"""transformers' greedy `generate` outputs, computed once and kept on disk.

The tests hold the served tokens to transformers' own float32 greedy `generate`
(test_correctness.py, test_worker_model_runner.py). Computing those references takes
a model load and a few hundred reference decode steps on every run; they depend only
on the model's files, the prompts, the generation settings and the library versions,
so they are kept in a cache keyed by all of these:

- the model: its resolved path and, for every file in it, the name, size and mtime;
- torch's and transformers' versions, and the CPU's model name (float32 kernels may
  round differently on another CPU);
- the prompts' token ids, the number of new tokens, EOS ignored or not, the dtype.

Any change in one of them is another key, so a stale entry is never read. The cache
lives in ~/.cache/cbserve/test-refs/ ($CBSERVE_TEST_REFS overrides it; it is outside
the repository, so every checkout of the same model shares it). A missing entry is
computed where it is first needed and written for the next run; `make test-refs`
(which `make test` depends on) computes every reference of the suite up front, so
that a clean clone pays for them once, before the tests:

    python -m tests.reference_cache          # compute what is missing, list all
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

CACHE_ENV = "CBSERVE_TEST_REFS"
# Bumped whenever what an entry means changes (how `generate` is called, the format).
FORMAT = 1


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cbserve" / "test-refs"


@dataclass(frozen=True)
class GreedyReference:
    """One set of greedy continuations: what to ask transformers' `generate`."""

    name: str  # a readable prefix for the file; the key makes it unique
    model_path: str
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    ignore_eos: bool
    dtype: str = "float32"

    def key(self) -> dict:
        return {
            "format": FORMAT,
            "model": model_fingerprint(self.model_path),
            "torch": version("torch"),
            "transformers": version("transformers"),
            "cpu": cpu_name(),
            "prompts": [list(prompt) for prompt in self.prompts],
            "max_new_tokens": self.max_new_tokens,
            "ignore_eos": self.ignore_eos,
            "dtype": self.dtype,
        }

    def path(self) -> Path:
        digest = hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()
        return cache_dir() / f"{self.name}-{digest[:20]}.json"


def model_fingerprint(model_path: str) -> dict:
    """The resolved path and every file's name, size and mtime (a directory's files,
    or the one file of a GGUF model)."""
    path = Path(model_path).resolve()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return {
        "path": str(path),
        "files": [[file.name, file.stat().st_size, file.stat().st_mtime_ns] for file in files],
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cached(reference: GreedyReference) -> list[list[int]] | None:
    """The stored outputs, or None when there is no entry (or an unreadable one)."""
    try:
        entry = json.loads(reference.path().read_text())
    except (OSError, ValueError):
        return None
    if entry.get("key") != reference.key():
        return None
    return entry["outputs"]


def greedy_outputs(
    reference: GreedyReference, load_model: Callable[[], object] | None = None
) -> list[list[int]]:
    """The cached outputs, computed (and stored) first if missing. `load_model` gives
    the transformers model to use on a miss (a session's own, to load it once);
    without it, the model is loaded from `reference.model_path`."""
    outputs = cached(reference)
    if outputs is not None:
        return outputs
    model = load_model() if load_model is not None else load_reference_model(reference)
    outputs = compute(model, reference)
    store(reference, outputs)
    return outputs


def load_reference_model(reference: GreedyReference):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        reference.model_path,
        dtype=getattr(torch, reference.dtype),
        attn_implementation="sdpa",
    )
    return model.eval()


def compute(model, reference: GreedyReference) -> list[list[int]]:
    """transformers' greedy `generate`, one prompt at a time (no padding)."""
    import torch

    eos = None if reference.ignore_eos else model.generation_config.eos_token_id
    outputs = []
    with torch.inference_mode():
        for prompt in reference.prompts:
            generated = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=reference.max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def store(reference: GreedyReference, outputs: list[list[int]]) -> None:
    """Written whole or not at all (another run may be reading or writing it)."""
    path = reference.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"key": reference.key(), "outputs": outputs}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
        json.dump(entry, out)
    os.replace(out.name, path)


def suite_references() -> list[GreedyReference]:
    """Every reference the suite reads, with the settings the suite runs with."""
    from tests.integration.conftest import integration_reference
    from tests.worker.test_worker_model_runner import runner_reference

    return [integration_reference(), runner_reference()]


def main() -> int:
    for reference in suite_references():
        started = time.monotonic()
        hit = cached(reference) is not None
        greedy_outputs(reference)
        took = "cached" if hit else f"computed in {time.monotonic() - started:.1f} s"
        print(f"test-refs: {reference.name}: {len(reference.prompts)} prompts, {took}")
        print(f"  {reference.path()}")
    # The prompt logprobs' (tests/prompt_reference.py): imported here, it imports this.
    from tests.integration.test_prompt_logprobs import prompt_reference
    from tests.prompt_reference import prompt_scores

    reference = prompt_reference()
    prompt_scores(reference)
    print(f"test-refs: {reference.name}: {len(reference.prompts)} prompts\n  {reference.path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
