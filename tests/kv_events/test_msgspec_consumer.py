"""vLLM's own subscriber decodes KV events with msgspec Structs (array_like, tagged by
class name): the same declarations, written here from the format's field names, must
read every batch the scheduler publishes. Skipped where msgspec is not installed (it is
no dependency of cbserve)."""

from __future__ import annotations

import pytest

msgspec = pytest.importorskip("msgspec")

from scheduler_svc.kv_events.replica import ReplicaKVEvents  # noqa: E402
from scheduler_svc.kv_events.wire import encode_batch  # noqa: E402
from tests.scheduler.harness import Harness, make_request, unique_prompt  # noqa: E402


class Event(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(Event):
    pass


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def test_a_msgspec_consumer_typed_as_vllms_events_decodes_every_batch():
    decoder = msgspec.msgpack.Decoder(Batch)
    payloads: list[bytes] = []
    harness = Harness(num_blocks=12, block_size=4, max_num_batched_tokens=32)
    replica = ReplicaKVEvents(lambda ts, events: payloads.append(encode_batch(ts, events)))
    harness.block_manager.events = replica
    for _ in range(10):
        harness.add(make_request(unique_prompt(13), max_tokens=2, ignore_eos=True))
        harness.run()
        replica.flush()
    batches = [decoder.decode(payload) for payload in payloads]
    kinds = {type(event).__name__ for batch in batches for event in batch.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    assert all(batch.data_parallel_rank == 0 for batch in batches)
    stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    assert all(e.medium == "GPU" and e.block_size == 4 and e.lora_id is None for e in stored)
    assert all(len(e.token_ids) == 4 * len(e.block_hashes) for e in stored)
