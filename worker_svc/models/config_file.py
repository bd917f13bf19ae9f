"""A checkpoint's config.json, read without transformers, and the config readings that
every architecture shares (rotary, layer types, attention dimensions).

transformers' `AutoConfig.from_pretrained` costs about 3 s of CPU at every worker start
(importing transformers and, through it, torch._dynamo) for a few dozen numbers. Each
architecture declares the keys it reads with transformers' defaults
(`Architecture.config_defaults`); a file whose every key is declared, or known to change
nothing, is read here. Anything else (a .gguf file, an unknown model type, a key such as
a quantization_config) makes `read_config_file` return None and the loader asks
transformers, which knows every key: an unknown key can make a start slower, never make
the model compute something else.

The readers below take either object, this file's `ConfigFile` or transformers' config:
both answer `getattr` with the same names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from worker_svc.models.declaration import Architecture, RopeSpec

# Keys that change nothing an own forward computes: token ids the scheduler takes from
# the tokenizer, training-time settings, provenance.
COMMON_IGNORED_KEYS = frozenset(
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
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
    }
)


class ConfigFile:
    """config.json's values with the architecture's defaults filled in, read by
    attribute as transformers' config objects are."""

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a ConfigFile is read-only")

    def get_text_config(self) -> ConfigFile:
        """transformers' accessor for multimodal configs; these are all text."""
        return self


def read_config_file(
    model_path: Path, architecture: Architecture, raw: dict[str, Any] | None = None
) -> ConfigFile | None:
    """The directory's config.json (or its already-read `raw` dict) for `architecture`,
    or None when this reader does not fully understand it (see the module's docstring).
    Raises ValueError (or OSError) for a file it should read but cannot."""
    if raw is None:
        raw = json.loads((model_path / "config.json").read_text())
    if not isinstance(raw, dict) or raw.get("model_type") not in architecture.model_types:
        return None
    known = set(architecture.config_defaults) | COMMON_IGNORED_KEYS
    if not (known | architecture.ignored_config_keys).issuperset(raw):
        return None
    values = {**architecture.config_defaults, **raw}
    architectures = values.get("architectures") or []
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"architectures must be a list of names, got {architectures!r}")
    return ConfigFile(values)


def raw_config(model_path: Path) -> dict[str, Any] | None:
    """config.json as a dict, or None where there is none (a .gguf file)."""
    config_file = model_path / "config.json"
    if not (model_path.is_dir() and config_file.is_file()):
        return None
    raw = json.loads(config_file.read_text())
    return raw if isinstance(raw, dict) else None


def attention_dims(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim), with the defaults transformers applies when a
    config leaves the last two out (no GQA; hidden_size split evenly over the heads)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and isinstance(heads, int) and heads > 0 and config.hidden_size % heads:
        raise ValueError(
            f"hidden_size ({config.hidden_size}) is not a multiple of "
            f"num_attention_heads ({heads}) and no head_dim is given"
        )
    return heads, kv_heads, head_dim or config.hidden_size // heads


def decoder_shape(config, tied_by_default: bool) -> dict[str, Any]:
    """The DecoderSpec fields every family reads the same way from its config."""
    heads, kv_heads, head_dim = attention_dims(config)
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": config.vocab_size,
        "max_positions": config.max_position_embeddings,
        "rms_norm_eps": float(config.rms_norm_eps),
        "tied_head": bool(getattr(config, "tie_word_embeddings", tied_by_default)),
    }


def rope_parameters(config, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters as transformers 5 standardizes them: `rope_parameters` (for
    Gemma 3 one dict per layer type), else the older `rope_scaling` beside a top-level
    `rope_theta`."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        theta = getattr(config, "rope_theta", None)
        if theta is not None:
            params.setdefault("rope_theta", theta)
    return dict(params)


def rope_spec(
    params: dict[str, Any], default_theta: float, max_positions: int | None = None
) -> RopeSpec:
    """Raises NotImplementedError for a scaling the own forward does not compute.
    `max_positions` (the config's max_position_embeddings) sets a YaRN factor the
    parameters leave out, as transformers does (DeepSeek-V3)."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3", "factors", "yarn"):
        raise NotImplementedError(f"rope_type {kind!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("a partial rotary factor")
    theta = float(params.get("rope_theta", default_theta))
    if kind == "default":
        return RopeSpec(theta)
    if kind == "linear":
        return RopeSpec(theta, "linear", factor=float(params["factor"]))
    if kind == "factors":
        return RopeSpec(theta, "factors", factors=tuple(params["factors"]))
    if kind == "yarn":
        return _yarn_spec(params, theta, max_positions)
    return RopeSpec(
        theta,
        "llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_positions=int(params["original_max_position_embeddings"]),
    )


def _yarn_spec(params: dict[str, Any], theta: float, max_positions: int | None) -> RopeSpec:
    """YaRN with transformers' defaults: beta_fast 32, beta_slow 1, truncated ramp bounds,
    and the attention factor from mscale/mscale_all_dim where both are given."""
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        if max_positions is None:
            raise NotImplementedError("a yarn rope without factor or max_position_embeddings")
        factor = max_positions / original
    factor = float(factor)
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None and mscale and mscale_all_dim:

        def yarn_mscale(scale: float) -> float:
            return 0.1 * scale * math.log(factor) + 1.0 if factor > 1 else 1.0

        attention_factor = yarn_mscale(mscale) / yarn_mscale(mscale_all_dim)
    return RopeSpec(
        theta,
        "yarn",
        factor=factor,
        original_max_positions=original,
        # transformers reads these with `or`: a 0 or null in a config means the default.
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
        attention_factor=None if attention_factor is None else float(attention_factor),
    )


def layer_types(config) -> list[str]:
    """Per layer "full_attention" or "sliding_attention", as transformers 5 declares
    them; a config without `layer_types` slides every layer if it has a window."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    sliding = getattr(config, "sliding_window", None) is not None
    kind = "sliding_attention" if sliding else "full_attention"
    return [kind] * config.num_hidden_layers


def activation_name(name: str) -> str:
    """transformers' activation names -> the two the own forward computes."""
    if name in ("silu", "swish"):
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise NotImplementedError(f"hidden_act {name!r}")


def read_declared_config(model_path: Path) -> tuple[ConfigFile, Architecture] | None:
    """A directory's config and its declared architecture, when an own forward covers it
    and this reader fully understands the file; else None (ask transformers)."""
    from worker_svc.models.architectures import architecture_for

    raw = raw_config(model_path)
    if raw is None:
        return None
    architecture = architecture_for(raw.get("architectures"), raw.get("model_type"))
    if architecture is None:
        return None
    config = read_config_file(model_path, architecture, raw)  # the file read once
    return None if config is None else (config, architecture)
