"""The worker's start-up settings, validated once so that nothing later re-checks them."""

from __future__ import annotations

from dataclasses import dataclass

from common.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WORKER_PORT

# Compute paths (worker_svc/compute/paths.py; kept torch-free here for the CLI).
# "auto" takes the fastest one this machine has (compute/selection.py).
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
# vLLM's names: the own forward where one exists, or transformers' modules.
MODEL_IMPLS = ("auto", "cbserve", "transformers")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "flash_attn")
# Default pool when neither a block count nor a byte budget is given: room for
# 64 sequences of 512 tokens, which is about 1.5 GB in float32 for the default model.
DEFAULT_KV_TOKENS = 64 * 512
# Measured per CPU by bench/kernel_bench.py; the table is worker_svc/compute/measured.py.
DEFAULT_DTYPE = "auto"

# On SIGTERM, seconds the scheduler gets to end the Step stream before the worker exits.
DEFAULT_GRACE_PERIOD_S = 30.0


@dataclass(frozen=True)
class WorkerConfig:
    model: str
    dtype: str = DEFAULT_DTYPE
    block_size: int = DEFAULT_BLOCK_SIZE
    # At most one of these two; with neither, DEFAULT_KV_TOKENS worth of blocks.
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    attention_backend: str = "auto"
    model_impl: str = "auto"
    # "auto" picks cuda:0 when torch sees a GPU, else cpu.
    device: str = "auto"
    threads: int | None = None
    host: str = "0.0.0.0"
    port: int = DEFAULT_WORKER_PORT

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model path must not be empty")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("give num_kv_blocks or kv_cache_memory, not both")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {MODEL_IMPLS}, got {self.model_impl!r}")
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"threads must be positive, got {self.threads}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
