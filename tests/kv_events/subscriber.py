"""A KV-event consumer as llm-d's indexer is one: the batch decoded as a msgpack array
[ts, events, dp_rank], each event by its tag, then a view of what the replica caches.

Two decodings, as llm-d has shipped them:
- positional (llm-d-kv-cache's vLLM adapter): the event array is one struct whose first
  field is the tag: [tag, block_hashes, parent, token_ids, block_size, lora_id, medium,
  lora_name] for BlockStored, [tag, block_hashes, medium] for BlockRemoved;
- tagged (llm-d-kv-cache-manager's pool): the tag is split off and the rest decoded on
  its own as the struct's array, fields in order; fields past the struct's are skipped.
Both must give the same events; anything else in a message is an error here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from scheduler_svc.core.prefix_hash import block_hash

_INT64 = 1 << 63
_UINT64 = 1 << 64


@dataclass(frozen=True)
class Stored:
    block_hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None


@dataclass(frozen=True)
class Removed:
    block_hashes: tuple[int, ...]
    medium: str | None


@dataclass(frozen=True)
class Cleared:
    pass


def _hash(value) -> int:
    assert isinstance(value, int) and 0 <= value < _UINT64, f"a hash must be a uint64: {value!r}"
    return value


def _positional(event: list):
    tag = event[0]
    if tag == "BlockStored":
        assert len(event) >= 5, event
        _, hashes, parent, tokens, size, *rest = event
        lora_id, medium = (rest + [None, None])[:2]
        assert lora_id is None
        return Stored(
            tuple(map(_hash, hashes)),
            None if parent is None else _hash(parent),
            tuple(tokens),
            size,
            medium,
        )
    if tag == "BlockRemoved":
        _, hashes, *rest = event
        return Removed(tuple(map(_hash, hashes)), rest[0] if rest else None)
    if tag == "AllBlocksCleared":
        return Cleared()
    raise AssertionError(f"unknown event tag {tag!r}")


def _tagged(raw_event: bytes):
    """The tag, then the fields re-encoded and decoded as their own array."""
    parts = msgpack.unpackb(raw_event)
    tag, tail = parts[0], msgpack.packb(parts[1:])
    fields = msgpack.unpackb(tail)
    return _positional([tag, *fields])


@dataclass
class Message:
    topic: bytes
    seq: int
    ts: float
    dp_rank: int | None
    events: list


def decode_message(frames: list[bytes]) -> Message:
    """The three frames of one message, decoded both ways (they must agree)."""
    assert len(frames) == 3, f"expected [topic, seq, payload], got {len(frames)} frames"
    topic, seq, payload = frames
    assert len(seq) == 8
    batch = msgpack.unpackb(payload)
    assert isinstance(batch, list) and len(batch) in (2, 3), batch
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float)
    positional = [_positional(event) for event in events]
    # Re-read each event's own bytes, as a decoder holding raw messages does.
    tagged = [_tagged(msgpack.packb(event)) for event in events]
    assert positional == tagged
    return Message(
        topic, int.from_bytes(seq, "big"), ts, batch[2] if len(batch) > 2 else None, positional
    )


def _signed(value: int) -> int:
    return value - _UINT64 if value >= _INT64 else value


@dataclass
class CacheView:
    """What a subscriber believes the replica caches, built from the events alone.

    Checks as it goes what an indexer relies on: sequence numbers without gaps, every
    stored chain's hashes chained block by block over its token ids (the scheduler's
    own hash: core/prefix_hash.py), a parent the view already holds, and no block
    stored twice or removed while not held.
    """

    blocks: set[int] = field(default_factory=set)
    next_seq: int = 0
    num_stored: int = 0
    num_removed: int = 0
    num_cleared: int = 0

    def apply(self, message: Message) -> None:
        assert message.seq == self.next_seq, f"seq {message.seq}, expected {self.next_seq}"
        self.next_seq += 1
        for event in message.events:
            self.apply_event(event)

    def apply_event(self, event) -> None:
        if isinstance(event, Cleared):
            self.num_cleared += 1
            self.blocks.clear()
        elif isinstance(event, Removed):
            for h in event.block_hashes:
                assert h in self.blocks, f"removed {h:#x}, which is not held"
                self.blocks.remove(h)
            self.num_removed += len(event.block_hashes)
        else:
            size = event.block_size
            assert len(event.token_ids) == size * len(event.block_hashes)
            parent = event.parent
            assert parent is None or parent in self.blocks, "a chain on an unknown parent"
            for index, h in enumerate(event.block_hashes):
                tokens = event.token_ids[index * size : (index + 1) * size]
                expected = block_hash(None if parent is None else _signed(parent), tokens)
                assert h == expected % _UINT64, f"block {index}'s hash is not chained"
                assert h not in self.blocks, f"stored {h:#x} twice"
                self.blocks.add(h)
                parent = h
            self.num_stored += len(event.block_hashes)
