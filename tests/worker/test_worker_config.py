"""Start-up settings: validation, byte budgets, pool sizing."""

from __future__ import annotations

import pytest
import torch

from worker_svc.__main__ import parse_bytes
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPool, KVPoolSpec

# The default model's shape: 30 layers, 3 KV heads of 64.
SPEC = KVPoolSpec(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize(
    "bad",
    [
        {"dtype": "int4"},
        {"model_impl": "vllm"},
        {"block_size": 0},
        {"num_kv_blocks": 4, "kv_cache_memory": 1 << 30},
        {"num_kv_blocks": 0},
        {"attention_backend": "xformers"},
        {"threads": 0},
        {"port": 70000},
    ],
)
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValueError):
        WorkerConfig(model="m", **bad)


def test_byte_sizes_are_binary():
    assert parse_bytes("1000") == 1000
    assert parse_bytes("1G") == parse_bytes("1GiB") == parse_bytes("1gb") == 1 << 30
    assert parse_bytes("512MiB") == 512 << 20


def test_pool_size_from_a_byte_budget():
    # 30 layers x K,V x 16 slots x 3 heads x 64 x 4 bytes.
    assert SPEC.bytes_per_block == 30 * 2 * 16 * 3 * 64 * 4
    assert SPEC.blocks_for_memory(10 * SPEC.bytes_per_block + 5) == 10
    with pytest.raises(ValueError, match="less than one block"):
        SPEC.blocks_for_memory(SPEC.bytes_per_block - 1)


def test_pool_layout_and_range_check():
    pool = KVPool(SPEC, 4)
    assert pool.cache.shape == (30, 2, 4, 16, 3, 64)
    assert pool.num_bytes == 4 * SPEC.bytes_per_block
    assert pool.out_of_range([0, 3, 4, -1]) == [4, -1]
