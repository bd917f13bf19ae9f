"""Where a worker reads its model from: a Hugging Face directory or a `.gguf` file.

The real worker (model_loader.py) and the null worker (null/worker.py), which reads
only the config and the tokenizer, accept the same two forms and refuse anything else
with the same words, so that a path one of them serves the other serves too. Nothing
here imports transformers: the own forward and the null worker start without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class ModelSourceError(ValueError):
    """The path is not a model the worker can read; the message names the path."""


@dataclass(frozen=True)
class ModelSource:
    path: Path
    # What transformers' from_pretrained is given: the directory, and for a GGUF
    # file its name inside that directory ({"gguf_file": name}).
    directory: str
    extra: dict[str, str] = field(default_factory=dict)


def model_source(model_path: str | Path) -> ModelSource:
    """Raises ModelSourceError for a path that is neither form, or does not exist."""
    path = Path(model_path)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path, str(path.parent), {"gguf_file": path.name})
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path, str(path))
    if not path.exists():
        raise ModelSourceError(f"model not found: {path} does not exist")
    raise ModelSourceError(
        f"cannot load model {path}: expected a Hugging Face directory with config.json "
        "or a .gguf file"
    )
