"""Own forwards by architecture, as named in a config's `architectures`.

One architecture a file; `ModelRunner` calls every implementation the same way:
`model(input_ids [T], positions [T], attention_context, sample_rows) -> logits`.
Architectures missing here run on transformers' modules (models.hf_model).
"""

from __future__ import annotations

from torch import nn

from worker_svc.models.llama import LlamaForCausalLM

# Mistral-style checkpoints use the Llama layout (no biases, GQA, SiLU MLP); a config
# field this forward cannot compute (a rope scaling, biases) sends them to transformers.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
}

MODEL_IMPLS = ("auto", "cbserve", "transformers")


def own_model_class(architectures: list[str] | None) -> type[nn.Module] | None:
    for name in architectures or ():
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    return None
