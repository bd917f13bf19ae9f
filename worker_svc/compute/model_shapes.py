"""The shapes of a model's projections, read from its config without loading a weight.

`--dtype auto` times the candidate compute paths on these shapes (compute/path_timing.py)
before the model is loaded, so they come from the cheapest source there is: a
directory's config.json (plain JSON, no transformers), or a GGUF file's metadata
(the `gguf` reader maps the file and reads its header; no tensor is touched).
Anything else, or a file that lacks a key, gives None, and the choice falls back to
the measured table (compute/measured.py): a worker never fails to start over this.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProjectionShapes:
    """What one decode step multiplies: per layer the fused QKV `[q + 2 kv, hidden]`, the
    output `[hidden, q]`, the fused gate/up `[2 intermediate, hidden]` and the down
    `[hidden, intermediate]`; once per step the LM head `[vocab, hidden]`."""

    hidden: int
    intermediate: int
    q_width: int  # heads * head_dim (not always hidden: Gemma, Qwen3)
    kv_width: int  # kv_heads * head_dim
    vocab: int
    layers: int

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def qkv_width(self) -> int:
        return self.q_width + 2 * self.kv_width

    def layer_projections(self) -> tuple[tuple[int, int], ...]:
        """(out, in) of each projection of one layer, in the order a layer runs them."""
        return (
            (self.qkv_width, self.hidden),
            (self.hidden, self.q_width),
            (2 * self.intermediate, self.hidden),
            (self.hidden, self.intermediate),
        )

    def head(self) -> tuple[int, int]:
        return (self.vocab, self.hidden)

    def describe(self) -> str:
        return (
            f"hidden {self.hidden}, intermediate {self.intermediate}, qkv {self.qkv_width}, "
            f"vocab {self.vocab}, {self.layers} layers"
        )


def read_projection_shapes(model_path: str | Path | None) -> ProjectionShapes | None:
    """The shapes of the model at `model_path`, or None where they cannot be read cheaply."""
    if model_path is None:
        return None
    path = Path(model_path)
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return _from_config(json.loads((path / "config.json").read_text()))
        if path.is_file() and path.suffix == ".gguf":
            return _from_gguf(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _from_config(config: dict[str, Any]) -> ProjectionShapes:
    # Multimodal configs (Gemma 3) keep the language model's numbers in text_config.
    config = config.get("text_config") or config
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return ProjectionShapes(
        hidden=hidden,
        intermediate=config["intermediate_size"],
        q_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        vocab=config["vocab_size"],
        layers=config["num_hidden_layers"],
    )


def _from_gguf(path: Path) -> ProjectionShapes:
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key: str):
        field = fields[key]
        return field.contents()

    arch = value("general.architecture")
    hidden = int(value(f"{arch}.embedding_length"))
    heads = int(value(f"{arch}.attention.head_count"))
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = int(value(kv_key)) if kv_key in fields else heads
    dim_key = f"{arch}.attention.key_length"
    head_dim = int(value(dim_key)) if dim_key in fields else hidden // heads
    vocab_key = f"{arch}.vocab_size"
    if vocab_key in fields:
        vocab = int(value(vocab_key))
    else:
        vocab = len(fields["tokenizer.ggml.tokens"].data)
    return ProjectionShapes(
        hidden=hidden,
        intermediate=int(value(f"{arch}.feed_forward_length")),
        q_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        vocab=vocab,
        layers=int(value(f"{arch}.block_count")),
    )
