"""The KV pool: one tensor allocated at start-up, addressed by scheduler-chosen block ids.

Layout `[layers, 2, num_blocks, block_size, kv_heads, head_dim]`: for one layer,
`[num_blocks, block_size, kv_heads, head_dim]` is what flash-attn's paged
kernels take as `k_cache`/`v_cache`, and its flat view
`[num_blocks * block_size, kv_heads, head_dim]` is indexed by slot
(`block_id * block_size + offset`) by the torch backend. The worker never picks
a block id; it only checks that the ids it is given are in range.

The pool's element type is the worker's --kv-cache-dtype: the compute dtype by default,
or a 16-bit type that holds twice the tokens in the same bytes. The attention backends
convert K/V to it when they write and back to the query's dtype when they read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from worker_svc.huge_pages import advise_huge_pages
from worker_svc.shared_kv_memory import SharedPoolMemory

# --kv-cache-dtype's explicit choices (worker_svc/config.py KV_CACHE_DTYPES, less "auto").
KV_CACHE_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# Compute paths whose "auto" pool is float16 on the CPU. q4_1 is llama.cpp's arithmetic,
# and like llama.cpp's (whose KV cache is float16 by default) its pool is 16-bit: it
# passes the same accuracy gate as the float32 pool and halves what decode attention
# reads (bench/RESULTS.md). The float32 path stays the reference, pool included.
AUTO_FLOAT16_PATHS = ("q4_1", "bfloat16-weights")  # the block paths


def kv_cache_dtype(
    name: str, compute_dtype: torch.dtype, compute_path: str = "", device_type: str = "cpu"
) -> torch.dtype:
    """The pool's element type for --kv-cache-dtype `name`: "auto" is the compute dtype,
    but float16 for the paths in AUTO_FLOAT16_PATHS on the CPU."""
    if name == "auto":
        if compute_path in AUTO_FLOAT16_PATHS and device_type == "cpu":
            return torch.float16
        return compute_dtype
    if name not in KV_CACHE_TORCH_DTYPES:
        raise ValueError(f"unknown kv cache dtype {name!r}")
    return KV_CACHE_TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float16` -> "float16", as the flags spell it."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class KVPoolSpec:
    """Shape and element type of one block, the unit of the pool."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"the KV pool holds floating-point values, not {self.dtype}")

    @property
    def bytes_per_element(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_block(self) -> int:
        per_layer = 2 * self.block_size * self.num_kv_heads * self.head_dim * self.bytes_per_element
        return self.num_layers * per_layer

    def blocks_for_memory(self, memory_bytes: int) -> int:
        blocks = memory_bytes // self.bytes_per_block
        if blocks <= 0:
            raise ValueError(
                f"kv_cache_memory={memory_bytes} bytes is less than one block "
                f"({self.bytes_per_block} bytes)"
            )
        return blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


class KVPool:
    def __init__(
        self,
        spec: KVPoolSpec,
        num_blocks: int,
        device: torch.device | str = "cpu",
        shared: bool = False,
    ):
        """shared: a CPU pool in shared memory that a worker on this host can copy moved
        blocks out of (shared_kv_memory.py); ignored on other devices."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        shape = (
            spec.num_layers,
            2,
            num_blocks,
            spec.block_size,
            spec.num_kv_heads,
            spec.head_dim,
        )
        self.shared_memory: SharedPoolMemory | None = None
        if shared and torch.device(device).type == "cpu":
            self.shared_memory = SharedPoolMemory(math.prod(shape) * spec.bytes_per_element)
            self.cache, self.huge_pages = self.shared_memory.tensor(shape, spec.dtype)
        else:
            self.cache = torch.empty(shape, dtype=spec.dtype, device=device)
            # Huge pages before the first write (huge_pages.py): blocks are read scattered.
            self.huge_pages = advise_huge_pages(self.cache)
        # Zeros, not garbage: attention multiplies masked-out slots by a zero weight,
        # and uninitialised memory may hold NaN, which survives that.
        self.cache.zero_()

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_bytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()

    @property
    def dtype(self) -> torch.dtype:
        return self.spec.dtype

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.spec.dtype)

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each `[num_blocks, block_size, kv_heads, head_dim]`."""
        return self.cache[layer_idx, 0], self.cache[layer_idx, 1]

    def layer_slots(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as slot arrays `[num_blocks * block_size, kv_heads, head_dim]`."""
        k, v = self.layer(layer_idx)
        shape = (self.num_blocks * self.block_size, self.spec.num_kv_heads, self.spec.head_dim)
        return k.view(shape), v.view(shape)

    def out_of_range(self, block_ids: Iterable[int]) -> list[int]:
        """The given ids that do not name a block of this pool."""
        return [b for b in block_ids if not 0 <= b < self.num_blocks]
