"""Loads a causal LM for the runner: the own forward where one exists, transformers'
modules otherwise, on the compute path the worker chose.

Accepts a local Hugging Face directory or a `.gguf` file; never reaches a hub
(`local_files_only`), because the service runs offline. The own forwards read the
weights themselves (safetensors, or the GGUF through the `gguf` package); the
transformers fallback loads through `from_pretrained` with the paged attention
registered. A declared architecture's config.json is read without transformers
(models/config_file.py), so that a worker on the own forward never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from worker_svc.attention import register_with_transformers
from worker_svc.compute.paths import PATHS, ComputePath
from worker_svc.errors import ModelLoadError
from worker_svc.model_source import ModelSourceError, model_source
from worker_svc.models import MODEL_IMPLS
from worker_svc.models.architectures import architecture_for
from worker_svc.models.checkpoint.gguf_config import read_gguf_config
from worker_svc.models.checkpoint.weights import load_state_dict
from worker_svc.models.config_file import attention_dims, raw_config, read_declared_config
from worker_svc.models.declaration import Architecture, DecoderSpec
from worker_svc.models.forward.decoder import DecoderForCausalLM
from worker_svc.models.forward.hf_model import TransformersCausalLM

__all__ = ["LoadedModel", "ModelLoadError", "load_model", "resolve_device"]


@dataclass(frozen=True)
class LoadedModel:
    # Called as model(input_ids [T], positions [T], attention context, sample_rows).
    model: nn.Module
    # The text config: a ConfigFile for a declared architecture's directory, else
    # transformers' own.
    config: Any
    # The directory or file name it was loaded from, as Describe reports it.
    name: str
    # Activations, attention and the KV cache; int8 projections keep float32 here.
    dtype: torch.dtype
    device: torch.device
    compute_path: str
    model_impl: str  # "cbserve" or "transformers"
    # The own forward's declaration and spec; None on transformers' modules.
    architecture: Architecture | None
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _source(model_path: Path) -> tuple[str, dict[str, str]]:
    try:
        source = model_source(model_path)
    except ModelSourceError as exc:
        raise ModelLoadError(str(exc)) from None
    return source.directory, source.extra


def load_model(
    model_path: str | Path,
    compute: str | torch.dtype | ComputePath,
    device: torch.device,
    model_impl: str = "auto",
    compile: bool = False,
) -> LoadedModel:
    """`compute` is a compute path (or its name, or a float dtype: float32 is the path
    "float32"). `compile`: the own forward through torch.compile (models/compiled.py);
    it compiles at its first calls. Raises ModelLoadError with the reason when it
    cannot be served."""
    compute_path = _as_path(compute)
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl must be one of {MODEL_IMPLS}, got {model_impl!r}")
    model_path = Path(model_path)
    source, extra = _source(model_path)
    text_config, architecture = _read_config(model_path, source, extra, model_impl)
    spec, why_not = _own_spec(architecture, text_config, model_impl)
    if spec is None and compute_path.needs_own_forward:
        raise ModelLoadError(f"--dtype {compute_path.name} needs the own forward: {why_not}")
    dtype = compute_path.activation_dtype
    if spec is not None:
        model = _build_own(architecture, spec, model_path, source, compute_path, dtype)
        impl = "cbserve"
    else:
        model = TransformersCausalLM(_load_transformers(model_path, source, extra, dtype))
        impl = "transformers"
    model.to(device).eval()
    model.requires_grad_(False)
    if compile:
        if impl != "cbserve":
            raise ModelLoadError("--compile needs the own forward (--model-impl cbserve)")
        from worker_svc.models.forward.compiled import CompiledForward

        model = CompiledForward(model)
    release_freed_memory()

    heads, kv_heads, head_dim = attention_dims(text_config)
    return LoadedModel(
        model=model,
        config=text_config,
        name=model_path.name,
        dtype=dtype,
        device=device,
        compute_path=compute_path.name,
        model_impl=impl,
        architecture=architecture if spec is not None else None,
        num_layers=text_config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=text_config.vocab_size,
        max_model_len=text_config.max_position_embeddings,
    )


def has_attention_sinks(model: nn.Module) -> bool:
    """Whether a loaded model's attention has sinks (gpt-oss: the own forward's layers,
    or transformers' modules), which the attention backend must then compute."""
    return any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in model.modules())


def release_freed_memory() -> None:
    """Hands the heap's free pages back to the system. Loading frees hundreds of MB of
    tensors of a few MB each (read, fused, replaced by blocks); glibc keeps freed heap
    memory for reuse, where it still counts as the worker's resident memory."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    malloc_trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)  # glibc only
    if malloc_trim is not None:
        malloc_trim(0)


def _read_config(model_path: Path, source: str, extra: dict, model_impl: str):
    """The text config and its declared architecture (or None). A declared
    architecture's config.json is read directly (no transformers on the own forward's
    start path); anything else, a GGUF included, through transformers' AutoConfig."""
    try:
        if model_impl != "transformers" and (declared := _declared_config(model_path)):
            return declared
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load model {model_path}: {exc}") from exc
    from transformers import AutoConfig

    _quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True, **extra)
    except Exception as exc:  # transformers raises many types; the model path is what matters
        raise ModelLoadError(f"cannot load model {model_path}: {exc}") from exc
    text = config.get_text_config()
    # A config read from a GGUF names no `architectures`: its model type decides.
    return text, architecture_for(getattr(text, "architectures", None), text.model_type)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _as_path(compute: str | torch.dtype | ComputePath) -> ComputePath:
    if isinstance(compute, ComputePath):
        return compute
    if isinstance(compute, torch.dtype):
        compute = str(compute).removeprefix("torch.")  # the float paths are named so
    if compute not in PATHS:
        raise ValueError(f"dtype must be one of {sorted(PATHS)}, got {compute!r}")
    return PATHS[compute]


def _declared_config(model_path: Path):
    """(config, architecture) read without transformers, from a GGUF's metadata or a
    directory's config.json; None where only transformers can read it."""
    if model_path.suffix == ".gguf":
        return read_gguf_config(model_path)
    return read_declared_config(model_path)


def _own_spec(
    architecture: Architecture | None, text_config, model_impl: str
) -> tuple[DecoderSpec | None, str]:
    """The own forward's spec of this checkpoint, or None and why not."""
    if model_impl == "transformers":
        return None, "--model-impl transformers was asked for"
    if architecture is None:
        names = getattr(text_config, "architectures", None) or "this architecture"
        why = f"no own forward for {names}"
    else:
        try:
            return architecture.spec(text_config), ""
        except NotImplementedError as exc:
            why = f"the own forward does not compute {exc}"
        except ValueError as exc:
            raise ModelLoadError(f"cannot load model: {exc}") from exc
    if model_impl == "cbserve":
        raise ModelLoadError(f"--model-impl cbserve: {why}")
    return None, why


def _build_own(
    architecture: Architecture,
    spec: DecoderSpec,
    model_path: Path,
    source: str,
    compute_path: ComputePath,
    dtype: torch.dtype,
) -> nn.Module:
    weights_at = model_path if model_path.suffix == ".gguf" else Path(source)
    # llama.cpp's converter stores Gemma's norms with the 1 already added.
    offset_applied = weights_at.suffix == ".gguf" and architecture.gguf_norms_plus_one
    heads, kv_heads = spec.num_heads, spec.num_kv_heads
    if compute_path.blocks:
        # Tensors read one at a time: the float32 projections are never all in memory.
        from worker_svc.models.checkpoint.tensors import CheckpointTensors
        from worker_svc.models.qblock.build import build_qblock

        try:
            checkpoint = CheckpointTensors(weights_at, architecture, heads, kv_heads)
        except Exception as exc:
            raise ModelLoadError(f"cannot read the weights of {model_path}: {exc}") from exc
        float_format = "BF16" if compute_path.name == "bfloat16-weights" else "Q8_0"
        return build_qblock(
            architecture, spec, checkpoint, model_path, dtype, offset_applied, float_format
        )
    if compute_path.name == "int8" and (missing := spec.unsupported(frozenset({"rope scaling"}))):
        raise ModelLoadError(f"--dtype int8 folds the Llama layout only, not {', '.join(missing)}")
    try:
        state = load_state_dict(weights_at, architecture, heads, kv_heads)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the weights of {model_path}: {exc}") from exc
    path = compute_path.name if compute_path.name != "int8" else "float32"
    model = DecoderForCausalLM(architecture, spec, state, path, dtype, offset_applied)
    if compute_path.name == "int8":
        from worker_svc.models.int8.smooth import quantize_to_int8

        del state
        quantize_to_int8(model)
    return model


def _load_transformers(model_path: Path, source: str, extra: dict, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    try:
        return AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype,
            attn_implementation=register_with_transformers(),
            local_files_only=True,
            **extra,
        )
    except Exception as exc:  # transformers raises many types; the model path is what matters
        raise ModelLoadError(f"cannot load model {model_path}: {exc}") from exc


def own_forward_serves(model_path: str | Path, model_impl: str) -> bool:
    """Whether the own forward will serve this model, as far as can be read without
    transformers: `--dtype auto` must not pick a path that needs the own forward for a
    model whose architecture has no declaration (it falls to transformers' modules). A
    declared architecture whose config only transformers reads counts as served."""
    if model_impl == "transformers":
        return False
    path = Path(model_path)
    try:
        declared = _declared_config(path)
        if declared is not None:
            config, architecture = declared
            architecture.spec(config)
            return True
        raw = raw_config(path) if path.suffix != ".gguf" else None
        # A declared family whose config only transformers reads: the loader decides.
        return raw is not None and (
            architecture_for(raw.get("architectures"), raw.get("model_type")) is not None
        )
    except (OSError, ValueError, KeyError, TypeError, NotImplementedError):
        return False
