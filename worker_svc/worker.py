"""What a worker is once built, and how many KV blocks its config asks for.

Both builders return a Worker: startup.build_worker (a model and its KV pool) and
null/worker.build_null_worker (no weights, a pool of block ids only). Both size
their pool the same way, so that --kv-cache-memory gives a null worker the block
count a float32 worker would have. Kept apart from either builder so that neither
imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cbserve.worker.v1 import worker_pb2
from worker_svc.config import DEFAULT_KV_TOKENS, WorkerConfig
from worker_svc.kv_pool import KVPoolSpec

if TYPE_CHECKING:
    from worker_svc.model_runner import ModelRunner


@dataclass(frozen=True)
class Worker:
    runner: ModelRunner
    description: worker_pb2.WorkerDescription
    # The forward thread's intra-op thread count, for the ready line.
    threads: int


def pool_blocks(config: WorkerConfig, spec: KVPoolSpec) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory is not None:
        return spec.blocks_for_memory(config.kv_cache_memory)
    return spec.blocks_for_tokens(DEFAULT_KV_TOKENS)
