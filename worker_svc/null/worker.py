"""Builds the Worker of `--model-impl null`: a model description, a pool of block ids
with no memory behind them, and the null runner."""

from __future__ import annotations

import uuid

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPool, KVPoolSpec, kv_cache_dtype
from worker_svc.null.model import read_null_model
from worker_svc.null.runner import NullRunner, StepTimeModel
from worker_svc.null.sampler import NullSampler
from worker_svc.worker import Worker, pool_blocks


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
    )
    # One thread: the server's forward thread, which only sleeps here.
    return Worker(runner, description, threads=1)
