"""The registry of architectures with an own forward: one module each, imported only when
a checkpoint names it (as vLLM's registry names module and class, so that a worker
never imports what it does not serve).

Adding an architecture is its module here, one line below, and its test.
"""

from __future__ import annotations

import importlib

from worker_svc.models.declaration import Architecture

# transformers' class name in a config's `architectures` -> the declaring module.
_BY_CLASS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MinistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "GptOssForCausalLM": "gpt_oss",
}
# A config.json's `model_type`, or a GGUF's `general.architecture` -> the module.
_BY_TYPE = {
    "llama": "llama",
    "mistral": "mistral",
    "ministral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "qwen3_moe": "qwen3_moe",
    "qwen3moe": "qwen3_moe",  # a GGUF's general.architecture
    "qwen2_moe": "qwen2_moe",
    "qwen2moe": "qwen2_moe",  # a GGUF's general.architecture
    "mixtral": "mixtral",
    "llama+experts": "mixtral",  # a GGUF "llama" with an expert_count
    "gpt_oss": "gpt_oss",
    "gpt-oss": "gpt_oss",  # a GGUF's general.architecture
}


def load_architecture(module: str) -> Architecture:
    return importlib.import_module(f"{__name__}.{module}").ARCHITECTURE


def architecture_for(
    class_names: list[str] | tuple[str, ...] | None, model_type: str | None = None
) -> Architecture | None:
    """The declaration for the first class name known here (else for the model type,
    which is all a GGUF's config names), or None."""
    for name in class_names or ():
        if name in _BY_CLASS:
            return load_architecture(_BY_CLASS[name])
    if model_type in _BY_TYPE:
        return load_architecture(_BY_TYPE[model_type])
    return None


def supported_architectures() -> list[str]:
    return sorted(_BY_CLASS)
