"""The bytes of moved KV (worker.proto's KvChunk): which blocks go in which chunk, and how
a chunk's blocks are read out of a pool and written into another.

A chunk's data is the pool's own layout `[layers, 2 (K, V), blocks, slots, kv_heads,
head_dim]` for the chunk's blocks, with only the filled slots of the transfer's last
block: so for each layer, K of each block, then V of each block. A run of blocks is read
out of the pool with one gather (the copy that holds a step) and turned into bytes apart
from it; written back with one scatter per run of full blocks and one slice copy for a
partly filled last block. Little-endian, as the pool holds it on every machine this runs
on (x86-64 and aarch64 Linux).

A pool with no memory behind it (the null worker's: num_bytes 0) sends chunks without
data and accepts only those, so that a scheduler on null workers moves "KV" as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cbserve.worker.v1 import worker_pb2
from common.grpc_options import MAX_MESSAGE_BYTES
from worker_svc.kv_pool import KVPool, dtype_name

# About what each KvChunk carries: big enough that a chunk's per-message cost (a gRPC
# frame, a hop to a thread) is small beside its copy, small enough that little is held
# in memory at once, and far below the 16 MiB message limit.
CHUNK_TARGET_BYTES = 2 * 1024 * 1024
# Room in a message for everything but the data (ids, slots, the layout).
MESSAGE_OVERHEAD_BYTES = 64 * 1024


class TransferError(ValueError):
    """A request or chunk that names blocks, slots or bytes wrong: INVALID_ARGUMENT."""


class LayoutMismatch(ValueError):
    """A pool of another shape or dtype: FAILED_PRECONDITION."""


def pool_layout(pool: KVPool) -> worker_pb2.KvLayout:
    spec = pool.spec
    return worker_pb2.KvLayout(
        num_layers=spec.num_layers,
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        dtype=dtype_name(spec.dtype),
    )


def describe_layout(layout: worker_pb2.KvLayout) -> str:
    return (
        f"layers={layout.num_layers} block_size={layout.block_size} "
        f"kv_heads={layout.num_kv_heads} head_dim={layout.head_dim} dtype={layout.dtype}"
    )


def check_layout(pool: KVPool, sent: worker_pb2.KvLayout) -> None:
    own = pool_layout(pool)
    if sent != own:
        raise LayoutMismatch(
            f"KV layout mismatch: the source's pool is {describe_layout(sent)}, "
            f"this worker's is {describe_layout(own)}"
        )


def holds_memory(pool: KVPool) -> bool:
    """False for the null worker's pool of block ids (worker_svc/null/worker.py)."""
    return pool.num_bytes > 0


def slot_bytes(pool: KVPool) -> int:
    """Bytes of one token slot in a chunk's data: K and V of every layer."""
    spec = pool.spec
    element = torch.empty((), dtype=spec.dtype).element_size()
    return spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * element


@dataclass(frozen=True)
class ChunkPlan:
    """One KvChunk's blocks: source and destination ids, and the filled slots of each."""

    source_block_ids: tuple[int, ...]
    destination_block_ids: tuple[int, ...]
    filled_slots: tuple[int, ...]


def plan_chunks(
    pool: KVPool,
    source_block_ids: list[int],
    destination_block_ids: list[int],
    num_tokens: int,
    target_bytes: int = CHUNK_TARGET_BYTES,
) -> list[ChunkPlan]:
    """The chunks of one SendKvRequest, after checking it (TransferError). Blocks past the
    ones num_tokens fills are not sent: they hold nothing."""
    block_size = pool.block_size
    if len(source_block_ids) != len(destination_block_ids):
        raise TransferError(
            f"{len(source_block_ids)} source block ids but "
            f"{len(destination_block_ids)} destination block ids: the lists are parallel"
        )
    if num_tokens <= 0:
        raise TransferError("num_tokens must be positive")
    if num_tokens > len(source_block_ids) * block_size:
        raise TransferError(
            f"num_tokens {num_tokens} does not fit {len(source_block_ids)} blocks "
            f"of {block_size} slots"
        )
    bad = pool.out_of_range(source_block_ids)
    if bad:
        raise TransferError(f"source block ids out of range 0..{pool.num_blocks - 1}: {bad}")
    if len(set(destination_block_ids)) != len(destination_block_ids):
        raise TransferError("destination block ids repeat: each block is written once")
    block_bytes = block_size * slot_bytes(pool)
    if block_bytes > MAX_MESSAGE_BYTES - MESSAGE_OVERHEAD_BYTES:
        raise TransferError(f"one block is {block_bytes} bytes, over a gRPC message's limit")
    per_chunk = max(1, target_bytes // block_bytes)
    num_blocks = -(-num_tokens // block_size)
    filled = [block_size] * (num_blocks - 1) + [num_tokens - (num_blocks - 1) * block_size]
    return [
        ChunkPlan(
            tuple(source_block_ids[i:end]),
            tuple(destination_block_ids[i:end]),
            tuple(filled[i:end]),
        )
        for i in range(0, num_blocks, per_chunk)
        for end in [min(i + per_chunk, num_blocks)]
    ]


def gather_blocks(pool: KVPool, block_ids: tuple[int, ...]) -> torch.Tensor:
    """A copy of the blocks, `[layers, 2, blocks, block_size, heads, dim]`, on the CPU
    (blocks that nothing writes while they are read: sender.py)."""
    index = torch.tensor(block_ids, dtype=torch.long, device=pool.cache.device)
    return pool.cache.index_select(2, index).cpu()


def blocks_to_bytes(blocks: torch.Tensor, filled_slots: tuple[int, ...]) -> bytes:
    """A chunk's data from gather_blocks' copy: only the filled slots of a partly filled
    last block (only the transfer's last block may be one)."""
    layers, kv, count, block_size = blocks.shape[:4]
    slots = blocks.reshape(layers, kv, count * block_size, *blocks.shape[4:])
    used = (count - 1) * block_size + filled_slots[-1]
    return _as_bytes(slots[:, :, :used].contiguous())


def _as_bytes(tensor: torch.Tensor) -> bytes:
    # uint8 first: numpy has no bfloat16.
    return tensor.view(torch.uint8).numpy().tobytes()


def check_chunk(pool: KVPool, chunk: worker_pb2.KvChunk) -> None:
    """TransferError where a chunk names blocks or slots this pool has not, or carries
    other than the bytes its slots take."""
    ids = list(chunk.destination_block_ids)
    if not ids or len(ids) != len(chunk.filled_slots):
        raise TransferError(
            f"a chunk names {len(ids)} destination blocks and {len(chunk.filled_slots)} "
            "filled-slot counts: the lists are parallel and not empty"
        )
    bad = pool.out_of_range(ids)
    if bad:
        raise TransferError(f"destination block ids out of range 0..{pool.num_blocks - 1}: {bad}")
    if any(not 0 < n <= pool.block_size for n in chunk.filled_slots):
        raise TransferError(
            f"filled slots must be 1..{pool.block_size}: {list(chunk.filled_slots)}"
        )
    if any(n != pool.block_size for n in chunk.filled_slots[:-1]):
        raise TransferError("only a chunk's last block may be partly filled")
    expected = sum(chunk.filled_slots) * slot_bytes(pool) if holds_memory(pool) else 0
    if len(chunk.data) != expected:
        raise TransferError(f"a chunk of {len(chunk.data)} bytes; its slots take {expected}")


def bytes_to_slots(pool: KVPool, chunk: worker_pb2.KvChunk) -> torch.Tensor:
    """A checked chunk's data as `[layers, 2, slots, heads, dim]` on the pool's device."""
    spec = pool.spec
    flat = torch.frombuffer(bytearray(chunk.data), dtype=torch.uint8).view(spec.dtype)
    shape = (spec.num_layers, 2, sum(chunk.filled_slots), spec.num_kv_heads, spec.head_dim)
    return flat.view(shape).to(pool.cache.device)


def write_blocks(pool: KVPool, block_ids: tuple[int, ...], slots: torch.Tensor) -> None:
    """bytes_to_slots' tensor into the blocks (blocks that no step reads or writes while
    they are written: receiver.py)."""
    block_size = pool.block_size
    used = slots.shape[2]
    full = used // block_size
    cache = pool.cache
    if full:
        index = torch.tensor(block_ids[:full], dtype=torch.long, device=cache.device)
        runs = slots[:, :, : full * block_size].reshape(
            *slots.shape[:2], full, block_size, *slots.shape[3:]
        )
        cache.index_copy_(2, index, runs)
    if used > full * block_size:
        cache[:, :, block_ids[full], : used - full * block_size] = slots[:, :, full * block_size :]
