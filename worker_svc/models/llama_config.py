"""A Llama checkpoint's config.json, read without transformers.

transformers' `AutoConfig.from_pretrained` costs about 3 s of CPU at every worker
start (importing transformers and, through it, torch._dynamo), for a dozen numbers the
own forward needs. This reads them straight from the file, with the defaults
transformers' LlamaConfig applies to the keys a file leaves out, so that a worker on
the own forward never imports transformers.

Only what it fully understands is read here: a directory holding a config.json of
model_type "llama" whose every key is in KNOWN_KEYS, with the default RoPE. Anything
else (a .gguf file, another model type, a RoPE scaling, a key this file does not know,
such as a quantization_config or a sliding window) makes `read_llama_config` return
None, and the loader asks transformers, which knows every key: an unknown key can make
the model go slower, never compute something else.

The field names are the file's keys, those of transformers' config: LlamaShape and
attention_dims read either object the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# LlamaConfig's defaults for keys a config.json may leave out (transformers 5.x).
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,  # None: as many as the query heads (no GQA)
    "head_dim": None,  # None: hidden_size / num_attention_heads
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
}
_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta")
# Keys that change nothing the own forward computes: token ids the scheduler takes from
# the tokenizer, training-time settings, provenance.
_IGNORED_KEYS = frozenset(
    {
        "_model_name_or_path",
        "_name_or_path",
        "architectures",
        "model_type",
        "attention_dropout",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "dtype",
        "torch_dtype",
        "initializer_range",
        "pretraining_tp",
        "transformers_version",
        "use_cache",
    }
)
KNOWN_KEYS = frozenset(_DEFAULTS) | frozenset(_ROPE_KEYS) | _IGNORED_KEYS


@dataclass(frozen=True)
class LlamaConfigFile:
    """The config.json of a Llama checkpoint, with LlamaConfig's defaults filled in."""

    architectures: tuple[str, ...]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        # The check transformers' LlamaConfig makes.
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """As transformers standardizes them; only the default RoPE is read here."""
        return {"rope_type": "default", "rope_theta": self.rope_theta}

    def get_text_config(self) -> LlamaConfigFile:
        """transformers' accessor for multimodal configs; a Llama one is all text."""
        return self


def read_llama_config(model_path: Path) -> LlamaConfigFile | None:
    """The directory's config.json as a LlamaConfigFile; None when it is not a Llama
    config this reader fully understands (see the module's docstring). Raises
    ValueError (or OSError) for a file it should read but cannot."""
    config_file = model_path / "config.json"
    if not (model_path.is_dir() and config_file.is_file()):
        return None
    raw = json.loads(config_file.read_text())
    if not isinstance(raw, dict) or raw.get("model_type") != "llama":
        return None
    if not KNOWN_KEYS.issuperset(raw):
        return None
    rope_theta = _default_rope_theta(raw)
    if rope_theta is None:
        return None
    values = {**_DEFAULTS, **{key: raw[key] for key in _DEFAULTS if key in raw}}
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if values["head_dim"] is None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    architectures = raw.get("architectures") or []
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"architectures must be a list of names, got {architectures!r}")
    values["rms_norm_eps"] = _as_float(values["rms_norm_eps"])
    return LlamaConfigFile(
        architectures=tuple(architectures), rope_theta=_as_float(rope_theta), **values
    )


def _as_float(value: Any) -> Any:
    """JSON writes 10000.0 as 10000; anything not a number is left for validation."""
    return float(value) if type(value) in (int, float) else value


def _default_rope_theta(raw: dict[str, Any]) -> Any:
    """The RoPE base when the file asks for the default RoPE, else None. transformers
    reads `rope_parameters`, or the older `rope_scaling` with a top-level `rope_theta`;
    a missing theta is LlamaConfig's 10000."""
    if raw.get("rope_parameters") and raw.get("rope_scaling"):
        return None  # which one wins is transformers' business
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict) or not set(rope) <= {"rope_type", "type", "rope_theta"}:
        return None
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return None
    return rope.get("rope_theta", raw.get("rope_theta", 10000.0))
