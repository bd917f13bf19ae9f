"""The bytes of moved KV (worker.proto's KvChunk): which blocks go in which chunk, and how
a chunk's blocks are read out of a pool and written into another.

A chunk's data is the pool's own layout `[layers, 2 (K, V), blocks, slots, kv_heads,
head_dim]` for the chunk's blocks, with only the filled slots of the transfer's last
block: so for each layer, K of each block, then V of each block. A run of blocks is read
out of the pool with one gather (the copy that holds a step) and turned into bytes apart
from it (or, for shared memory, gathered straight into the segment's slot: gather_into);
written back with one copy per run of consecutive block ids. Little-endian, as the pool
holds it on every machine this runs on (x86-64 and aarch64 Linux).

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


def chunk_bytes(pool: KVPool, plan: ChunkPlan) -> int:
    return sum(plan.filled_slots) * slot_bytes(pool)


def _slots(pool: KVPool, num_slots: int, flat: torch.Tensor) -> torch.Tensor:
    """A chunk's uint8 bytes viewed as `[layers, 2, slots, heads, dim]` of the pool's dtype."""
    spec = pool.spec
    shape = (spec.num_layers, 2, num_slots, spec.num_kv_heads, spec.head_dim)
    return flat.view(spec.dtype).view(shape)


def gather_into(pool: KVPool, plan: ChunkPlan, out: torch.Tensor) -> None:
    """gather_blocks and blocks_to_bytes in one copy: the plan's filled slots written
    straight into out (uint8, chunk_bytes long: a shared-memory slot), one copy per run
    of consecutive block ids (a run's slots are one strided view of the pool)."""
    slots = _slots(pool, sum(plan.filled_slots), out)
    for first, end, at, count in _runs(plan.source_block_ids, plan.filled_slots):
        slots[:, :, at : at + count].copy_(pool.cache[:, :, first:end].flatten(2, 3)[:, :, :count])


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
    if bool(chunk.data) + bool(chunk.shm_name) + bool(chunk.source_block_ids) > 1:
        raise TransferError(
            "a chunk's bytes are in one place: its data, a shared-memory segment, or the "
            "source's pool (source_block_ids)"
        )
    if chunk.source_block_ids:  # no bytes: copied from the source's pool (pool_read.py)
        if len(chunk.source_block_ids) != len(ids):
            raise TransferError("a chunk's source and destination block ids are parallel")
        return
    expected = sum(chunk.filled_slots) * slot_bytes(pool) if holds_memory(pool) else 0
    if payload_bytes(chunk) != expected:
        raise TransferError(f"a chunk of {payload_bytes(chunk)} bytes; its slots take {expected}")


def payload_bytes(chunk: worker_pb2.KvChunk) -> int:
    """The chunk's bytes, in its message or in shared memory."""
    return chunk.shm_bytes if chunk.shm_name else len(chunk.data)


def bytes_to_slots(pool: KVPool, chunk: worker_pb2.KvChunk) -> torch.Tensor:
    """A checked chunk's data as `[layers, 2, slots, heads, dim]` on the pool's device."""
    return view_slots(pool, chunk, torch.frombuffer(bytearray(chunk.data), dtype=torch.uint8))


def view_slots(pool: KVPool, chunk: worker_pb2.KvChunk, flat: torch.Tensor) -> torch.Tensor:
    """A checked chunk's bytes, given as a uint8 tensor (a shared-memory view), as
    bytes_to_slots' tensor: no copy on a CPU pool."""
    return _slots(pool, sum(chunk.filled_slots), flat).to(pool.cache.device)


def write_blocks(pool: KVPool, block_ids: tuple[int, ...], slots: torch.Tensor) -> None:
    """bytes_to_slots' tensor into the blocks (blocks that no step reads or writes while
    they are written: receiver.py), one copy per run of consecutive block ids: on a CPU
    about twice as fast as one index_copy_ of the full blocks (44 MiB: 5 ms against 9-15)."""
    used = slots.shape[2]
    block_size = pool.block_size
    filled = [block_size] * (len(block_ids) - 1) + [used - (len(block_ids) - 1) * block_size]
    for first, end, at, count in _runs(block_ids, filled):
        pool.cache[:, :, first:end].flatten(2, 3)[:, :, :count].copy_(slots[:, :, at : at + count])


def _runs(block_ids, filled_slots):
    """(first id, last id + 1, first slot in the chunk, slots) of each run of consecutive
    block ids: a run's slots are one strided view of the pool (dims 2 and 3 flattened)."""
    at, i = 0, 0
    while i < len(block_ids):
        end = i + 1
        while end < len(block_ids) and block_ids[end] == block_ids[end - 1] + 1:
            end += 1
        count = sum(filled_slots[i:end])
        yield block_ids[i], block_ids[end - 1] + 1, at, count
        at, i = at + count, end
