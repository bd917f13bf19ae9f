"""What the fake worker's KV slots hold (fake_worker.py): the token written there and a
fingerprint of its whole context, so that two sequences' KV at a position are equal
exactly when their tokens up to it are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotKV:
    """What one KV slot holds: the token written there and its whole context."""

    token_id: int
    position: int
    # Python's hash of the tokens up to and including this one: equal for two
    # sequences exactly when their KV at this position is equal.
    context: int


def contexts_of(token_ids: Sequence[int]) -> list[int]:
    """Per position, a fingerprint of the tokens up to and including it."""
    contexts, running = [], 0
    for token_id in token_ids:
        running = hash((running, token_id))
        contexts.append(running)
    return contexts
