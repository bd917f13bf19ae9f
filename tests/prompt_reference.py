"""transformers' own prompt logprobs (float32), computed once and kept on disk beside
the greedy references (tests/reference_cache.py: same directory, same kind of key).

For each prompt, at every position but the first: the logprob the model gives the
prompt token there (log-softmax of the logits one position earlier), and the
NUM_TOP most likely tokens with theirs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from tests.reference_cache import cache_dir, cached, cpu_name, model_fingerprint, store

NUM_TOP = 3


@dataclass(frozen=True)
class PromptScoresReference:
    name: str
    model_path: str
    prompts: tuple[tuple[int, ...], ...]
    dtype: str = "float32"

    def key(self) -> dict:
        return {
            "kind": "prompt_logprobs",
            "model": model_fingerprint(self.model_path),
            "torch": version("torch"),
            "transformers": version("transformers"),
            "cpu": cpu_name(),
            "prompts": [list(prompt) for prompt in self.prompts],
            "num_top": NUM_TOP,
            "dtype": self.dtype,
        }

    def path(self) -> Path:
        digest = hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()
        return cache_dir() / f"{self.name}-{digest[:20]}.json"


def prompt_scores(reference: PromptScoresReference) -> list[dict]:
    """Per prompt: {"logprobs": [...], "top_ids": [[...]], "top_logprobs": [[...]]} for
    positions 1 .. len - 1; from the cache, computed (and stored) on a miss."""
    scores = cached(reference)
    if scores is None:
        scores = _compute(reference)
        store(reference, scores)
    return scores


def _compute(reference: PromptScoresReference) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        reference.model_path, dtype=getattr(torch, reference.dtype), attn_implementation="sdpa"
    ).eval()
    scores = []
    with torch.inference_mode():
        for prompt in reference.prompts:
            logits = model(torch.tensor([prompt])).logits[0, :-1].float()
            logprobs = logits.log_softmax(-1)
            chosen = logprobs.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
            top_values, top_ids = logprobs.topk(NUM_TOP, dim=-1)
            scores.append(
                {
                    "logprobs": chosen.tolist(),
                    "top_ids": top_ids.tolist(),
                    "top_logprobs": top_values.tolist(),
                }
            )
    return scores
