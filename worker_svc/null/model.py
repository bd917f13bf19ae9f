"""The null worker's model: its description and vocabulary, read without weights.

A Llama directory with a plain tokenizer is read without transformers
(models/llama_config.py, tokenizer.py): importing it costs seconds at every null
worker start. Anything else is read through transformers, from the same two kinds of
source the real worker loads (model_source.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker_svc.config import WorkerConfig
from worker_svc.model_source import model_source
from worker_svc.models.dims import attention_dims
from worker_svc.models.llama_config import read_llama_config
from worker_svc.null.sampler import NullVocabulary, ordinary_token_ids
from worker_svc.null.tokenizer import read_tokenizer_files


@dataclass(frozen=True)
class NullModel:
    """The model as the runner and Describe see it; there are no weights behind it."""

    name: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_impl: str = "null"
    compute_path: str = "null"


def read_null_model(config: WorkerConfig) -> tuple[NullModel, NullVocabulary]:
    """Raises ModelSourceError (a ValueError) for a path that is no model."""
    source = model_source(config.model)
    path = source.path
    text_config = read_llama_config(path)
    tokenizer = read_tokenizer_files(path)
    if text_config is None or tokenizer is None:
        from transformers import AutoConfig, AutoTokenizer

        if text_config is None:
            text_config = AutoConfig.from_pretrained(
                source.directory, local_files_only=True, **source.extra
            ).get_text_config()
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(
                source.directory, local_files_only=True, **source.extra
            )
    _, num_kv_heads, head_dim = attention_dims(text_config)
    model = NullModel(
        name=path.name,
        vocab_size=text_config.vocab_size,
        max_model_len=text_config.max_position_embeddings,
        num_layers=text_config.num_hidden_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    vocabulary = NullVocabulary(
        token_ids=ordinary_token_ids(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        eos_probability=config.null_eos_probability,
    )
    return model, vocabulary
