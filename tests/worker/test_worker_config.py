"""Start-up settings: validation, byte budgets, pool sizing."""

from __future__ import annotations

import pytest
import torch

from worker_svc.__main__ import parse_bytes
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPool, KVPoolSpec, kv_cache_dtype
from worker_svc.worker import pool_blocks

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
        {"kv_cache_dtype": "fp8"},
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


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # flash-attn takes K/V in the query's 16-bit dtype.
        ({"attention_backend": "flash_attn", "kv_cache_dtype": "float32"}, "cannot be read"),
        (
            {"attention_backend": "flash_attn", "dtype": "bfloat16", "kv_cache_dtype": "float16"},
            "the model's dtype bfloat16",
        ),
        # The C kernel reads float32 and float16 pools only.
        ({"attention_backend": "cpu", "kv_cache_dtype": "bfloat16"}, "not bfloat16"),
    ],
)
def test_kv_cache_dtypes_no_backend_can_read_are_refused(settings, message):
    with pytest.raises(ValueError, match=message) as refused:
        WorkerConfig(model="m", **settings)
    assert "--kv-cache-dtype" in str(refused.value) or "--attention-backend" in str(refused.value)


@pytest.mark.parametrize(
    "settings",
    [
        {"kv_cache_dtype": "float16"},
        {"kv_cache_dtype": "bfloat16", "attention_backend": "torch"},
        {"kv_cache_dtype": "float16", "attention_backend": "cpu", "dtype": "q4_1"},
        {"kv_cache_dtype": "bfloat16", "attention_backend": "flash_attn", "dtype": "bfloat16"},
        {"kv_cache_dtype": "float16", "attention_backend": "flash_attn", "dtype": "auto"},
    ],
)
def test_kv_cache_dtypes_a_backend_reads_are_accepted(settings):
    assert WorkerConfig(model="m", **settings).kv_cache_dtype == settings["kv_cache_dtype"]


def test_auto_is_the_compute_dtype_but_float16_for_q4_1_on_the_cpu():
    assert kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("auto", torch.float32, "float32", "cpu") == torch.float32
    assert kv_cache_dtype("auto", torch.float32, "int8", "cpu") == torch.float32
    assert kv_cache_dtype("auto", torch.float32, "q4_1", "cpu") == torch.float16
    assert kv_cache_dtype("auto", torch.float32, "q4_1", "cuda") == torch.float32
    assert kv_cache_dtype("float32", torch.float32, "q4_1", "cpu") == torch.float32
    assert kv_cache_dtype("float16", torch.float32) == torch.float16


def test_a_float16_pool_holds_twice_the_blocks_in_the_same_memory():
    budget = 1 << 30
    half = KVPoolSpec(30, 3, 64, 16, torch.float16)
    assert half.bytes_per_block * 2 == SPEC.bytes_per_block
    float32_blocks = pool_blocks(WorkerConfig(model="m", kv_cache_memory=budget), SPEC)
    float16_blocks = pool_blocks(
        WorkerConfig(model="m", kv_cache_memory=budget, kv_cache_dtype="float16"), half
    )
    assert float16_blocks == 2 * float32_blocks == 2 * (budget // SPEC.bytes_per_block)
    pool = KVPool(half, 4)
    assert pool.cache.dtype == torch.float16 and pool.dtype_name == "float16"
    assert pool.num_bytes == 4 * half.bytes_per_block


def test_the_pool_holds_floating_point_values():
    with pytest.raises(ValueError, match="floating-point"):
        KVPoolSpec(30, 3, 64, 16, torch.int8)
