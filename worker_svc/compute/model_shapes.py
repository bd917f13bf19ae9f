"""The shapes of a model's projections, read from its config without loading a weight.

`--dtype auto` times the candidate compute paths on these shapes (compute/path_timing.py)
before the model is loaded, so they come from the cheapest source there is: a
directory's config.json (plain JSON, no transformers), or a GGUF file's metadata
(its header, read directly; no tensor is touched).
Anything else, or a file that lacks a key, gives None, and the choice falls back to
the measured table (compute/measured.py): a worker never fails to start over this.
"""

from __future__ import annotations

import json
import struct
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
        intermediate=_active_intermediate(
            config["intermediate_size"],
            config.get("moe_intermediate_size"),
            config.get("num_experts_per_tok"),
            config.get("shared_expert_intermediate_size"),
        ),
        q_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        vocab=config["vocab_size"],
        layers=config["num_hidden_layers"],
    )


def _from_gguf(path: Path) -> ProjectionShapes:
    fields = read_gguf_numbers(path)
    arch = fields["general.architecture"]
    hidden = fields[f"{arch}.embedding_length"]
    heads = fields[f"{arch}.attention.head_count"]
    kv_heads = fields.get(f"{arch}.attention.head_count_kv", heads)
    head_dim = fields.get(f"{arch}.attention.key_length", hidden // heads)
    vocab = fields.get(f"{arch}.vocab_size", fields.get("tokenizer.ggml.tokens"))
    return ProjectionShapes(
        hidden=hidden,
        intermediate=_active_intermediate(
            fields[f"{arch}.feed_forward_length"],
            fields.get(f"{arch}.expert_feed_forward_length"),
            fields.get(f"{arch}.expert_used_count") if fields.get(f"{arch}.expert_count") else None,
            fields.get(f"{arch}.expert_shared_feed_forward_length"),
        ),
        q_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        vocab=vocab,
        layers=fields[f"{arch}.block_count"],
    )


def _active_intermediate(
    dense: int, per_expert: int | None, experts_per_token: int | None, shared: int | None = None
) -> int:
    """A mixture's MLP width as one token reads it: its k experts side by side (a
    family without its own expert width, Mixtral, sizes experts by intermediate_size),
    and its shared expert where it has one (Qwen2-MoE). What `auto` times at one row is
    then the bytes a decode step reads."""
    if not experts_per_token:
        return dense
    return (per_expert or dense) * experts_per_token + (shared or 0)


# GGUF's metadata value types: the struct format of each fixed-size one.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_SCALARS |= {10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_gguf_numbers(path: Path) -> dict[str, Any]:
    """A GGUF file's metadata: scalars and strings by key, arrays as their length.

    Read from the header directly (GGUF v2/v3, little-endian): the `gguf` package's
    reader decodes every array too (a 49,152-token vocabulary and its merges), about
    3 s here, for a handful of numbers needed at each start."""
    with path.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack("<I", file.read(4))
        if version < 2:
            raise ValueError(f"GGUF version {version} is not read here")
        _tensors, count = struct.unpack("<QQ", file.read(16))
        fields: dict[str, Any] = {}
        for _ in range(count):
            key = _string(file)
            (kind,) = struct.unpack("<I", file.read(4))
            if kind == _ARRAY:
                item_kind, length = struct.unpack("<IQ", file.read(12))
                _skip(file, item_kind, length)
                fields[key] = length
            else:
                fields[key] = _value(file, kind)
        return fields


def _string(file) -> str:
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode("utf-8", errors="replace")


def _value(file, kind: int):
    if kind == _STRING:
        return _string(file)
    fmt = "<" + _SCALARS[kind]
    return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]


def _skip(file, kind: int, length: int) -> None:
    if kind in _SCALARS:
        file.seek(length * struct.calcsize(_SCALARS[kind]), 1)
    elif kind == _STRING:
        for _ in range(length):
            (size,) = struct.unpack("<Q", file.read(8))
            file.seek(size, 1)
    else:  # arrays of arrays: not in any model's shapes
        raise ValueError(f"nested GGUF array of type {kind}")
