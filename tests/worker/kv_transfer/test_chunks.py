"""The chunks of a KV transfer without a process: planned, read out of one pool, turned
into bytes and written into another, for each pool dtype; and what is refused."""

from __future__ import annotations

import pytest
import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.kv_transfer.layout import (
    LayoutMismatch,
    TransferError,
    blocks_to_bytes,
    bytes_to_slots,
    check_chunk,
    check_layout,
    gather_blocks,
    plan_chunks,
    pool_layout,
    slot_bytes,
    write_blocks,
)


def random_pool(dtype: torch.dtype, num_blocks: int = 12, block_size: int = 4) -> KVPool:
    spec = KVPoolSpec(num_layers=3, num_kv_heads=2, head_dim=8, block_size=block_size, dtype=dtype)
    pool = KVPool(spec, num_blocks)
    pool.cache.copy_(torch.randn(pool.cache.shape).to(dtype))
    return pool


def move(source: KVPool, destination: KVPool, src_ids, dst_ids, num_tokens, target_bytes):
    plans = plan_chunks(source, src_ids, dst_ids, num_tokens, target_bytes)
    for plan in plans:
        data = blocks_to_bytes(gather_blocks(source, plan.source_block_ids), plan.filled_slots)
        chunk = worker_pb2.KvChunk(
            transfer_id=1,
            destination_block_ids=plan.destination_block_ids,
            filled_slots=plan.filled_slots,
            data=data,
        )
        check_chunk(destination, chunk)
        write_blocks(destination, plan.destination_block_ids, bytes_to_slots(destination, chunk))
    return plans


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_moves_exactly_the_filled_slots(dtype):
    source, destination = random_pool(dtype), random_pool(dtype)
    before = destination.cache.clone()
    src_ids, dst_ids = [5, 0, 9, 3, 7], [1, 11, 2, 8, 4]
    num_tokens = 4 * 4 + 2  # four full blocks, two slots of the fifth
    block_bytes = 4 * slot_bytes(source)
    plans = move(source, destination, src_ids, dst_ids, num_tokens, 2 * block_bytes)
    assert [len(p.source_block_ids) for p in plans] == [2, 2, 1]
    assert plans[-1].filled_slots == (2,)
    for src, dst in zip(src_ids[:4], dst_ids[:4], strict=True):
        assert torch.equal(destination.cache[:, :, dst], source.cache[:, :, src])
    assert torch.equal(destination.cache[:, :, 4, :2], source.cache[:, :, 7, :2])
    # The last block's unfilled slots, and every block not named, are as they were.
    assert torch.equal(destination.cache[:, :, 4, 2:], before[:, :, 4, 2:])
    untouched = [b for b in range(12) if b not in dst_ids]
    assert torch.equal(destination.cache[:, :, untouched], before[:, :, untouched])


def test_a_chunk_data_is_the_pool_layout_of_its_slots():
    source = random_pool(torch.float32)
    (plan,) = plan_chunks(source, [2, 6], [0, 1], 6)
    data = blocks_to_bytes(gather_blocks(source, plan.source_block_ids), plan.filled_slots)
    assert len(data) == 6 * slot_bytes(source) == 6 * 3 * 2 * 2 * 8 * 4
    slots = torch.frombuffer(bytearray(data), dtype=torch.float32).view(3, 2, 6, 2, 8)
    # Layer 1's V: block 2's four slots, then block 6's first two.
    assert torch.equal(slots[1, 1, :4], source.cache[1, 1, 2])
    assert torch.equal(slots[1, 1, 4:], source.cache[1, 1, 6, :2])


def test_trailing_empty_blocks_are_not_sent():
    source = random_pool(torch.float32)
    plans = plan_chunks(source, [1, 2, 3], [4, 5, 6], 5)
    assert [p.source_block_ids for p in plans] == [(1, 2)]
    assert plans[0].filled_slots == (4, 1)


@pytest.mark.parametrize(
    ("src", "dst", "num_tokens", "message"),
    [
        ([1, 2], [3], 5, "parallel"),
        ([1], [2], 0, "positive"),
        ([1], [2], 5, "does not fit"),
        ([1, 12], [2, 3], 5, r"source block ids out of range 0\.\.11: \[12\]"),
        ([1, 2], [3, 3], 5, "repeat"),
    ],
)
def test_bad_requests_are_refused(src, dst, num_tokens, message):
    with pytest.raises(TransferError, match=message):
        plan_chunks(random_pool(torch.float32), src, dst, num_tokens)


def test_bad_chunks_are_refused():
    pool = random_pool(torch.float32)
    one_slot = b"\0" * slot_bytes(pool)
    cases = [
        (worker_pb2.KvChunk(destination_block_ids=[12], filled_slots=[1], data=one_slot), "range"),
        (worker_pb2.KvChunk(destination_block_ids=[1], filled_slots=[], data=one_slot), "parallel"),
        (worker_pb2.KvChunk(destination_block_ids=[1], filled_slots=[5], data=one_slot), "1..4"),
        (worker_pb2.KvChunk(destination_block_ids=[1, 2], filled_slots=[1, 1]), "partly"),
        (worker_pb2.KvChunk(destination_block_ids=[1], filled_slots=[2], data=one_slot), "bytes"),
    ]
    for chunk, message in cases:
        with pytest.raises(TransferError, match=message):
            check_chunk(pool, chunk)


def test_a_layout_of_another_dtype_is_refused_naming_both():
    sent = pool_layout(random_pool(torch.bfloat16))
    check_layout(random_pool(torch.bfloat16), sent)
    with pytest.raises(LayoutMismatch, match="dtype=bfloat16.*dtype=float32"):
        check_layout(random_pool(torch.float32), sent)
