"""Builds the Worker of `--model-impl null`: the model's description and vocabulary
read without weights, a pool of block ids with no memory behind them, the null runner.

A Llama directory with a plain tokenizer is read without transformers
(models/config_file.py, tokenizer.py): importing it costs seconds at every null
worker start. Anything else is read through transformers, from the same two kinds of
source the real worker loads (model_source.py).
"""

from __future__ import annotations

import uuid

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPool, KVPoolSpec, kv_cache_dtype
from worker_svc.model_source import model_source
from worker_svc.models.config_file import attention_dims, read_declared_config
from worker_svc.null.runner import NullModel, NullRunner, StepTimeModel
from worker_svc.null.sampler import NullSampler, NullVocabulary, ordinary_token_ids
from worker_svc.null.tokenizer import read_tokenizer_files
from worker_svc.worker import Worker, pool_blocks


def read_null_model(config: WorkerConfig) -> tuple[NullModel, NullVocabulary]:
    """Raises ModelSourceError (a ValueError) for a path that is no model."""
    source = model_source(config.model)
    path = source.path
    declared = read_declared_config(path)
    text_config = declared[0] if declared else None
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


class NullKVPool(KVPool):
    """A pool of block ids with no memory behind them: only range checks need it."""

    def __init__(self, spec: KVPoolSpec, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks

    @property
    def num_bytes(self) -> int:
        return 0


def build_null_worker(config: WorkerConfig) -> Worker:
    model, vocabulary = read_null_model(config)
    # The float32 paths' pool dtype (unless --kv-cache-dtype says otherwise), so that
    # --kv-cache-memory gives the same block count as a float32 worker's.
    spec = KVPoolSpec(
        num_layers=model.num_layers,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        block_size=config.block_size,
        dtype=kv_cache_dtype(config.kv_cache_dtype, torch.float32),
    )
    pool = NullKVPool(spec, pool_blocks(config, spec))
    step_time = StepTimeModel(config.null_step_ms, config.null_step_us_per_token)
    runner = NullRunner(model, pool, NullSampler(vocabulary), step_time)
    description = worker_pb2.WorkerDescription(
        model_name=model.name,
        dtype=model.compute_path,
        device="none",
        num_kv_blocks=pool.num_blocks,
        block_size=config.block_size,
        max_model_len=model.max_model_len,
        vocab_size=model.vocab_size,
        attention_backend="none",
        instance_id=uuid.uuid4().hex,
        model_impl=model.model_impl,
        processor=cpu_name(),
        accepts_deferred_masks=True,
    )
    # One thread: the server's forward thread, which only sleeps here.
    return Worker(runner, description, threads=1)
