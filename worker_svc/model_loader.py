"""Loads a causal LM with transformers, with the paged attention selected.

Accepts a local Hugging Face directory or a `.gguf` file; never reaches a hub
(`local_files_only`), because the service runs offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from worker_svc.attention import register_with_transformers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message names the path."""


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    # The directory or file name it was loaded from, as Describe reports it.
    name: str
    dtype: torch.dtype
    device: torch.device
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        source, extra = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir() and (path / "config.json").is_file():
        source, extra = str(path), {}
    elif not path.exists():
        raise ModelLoadError(f"model not found: {path} does not exist")
    else:
        raise ModelLoadError(
            f"cannot load model {path}: expected a Hugging Face directory with config.json "
            "or a .gguf file"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype,
            attn_implementation=register_with_transformers(),
            local_files_only=True,
            **extra,
        )
    except Exception as exc:  # transformers raises many types; the path is what matters
        raise ModelLoadError(f"cannot load model {path}: {exc}") from exc
    model.to(device).eval()
    model.requires_grad_(False)

    config = model.config.get_text_config()
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return LoadedModel(
        model=model,
        name=path.name,
        dtype=dtype,
        device=device,
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        vocab_size=model.get_output_embeddings().out_features,
        max_model_len=config.max_position_embeddings,
    )
