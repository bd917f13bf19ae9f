"""What a KV transfer does to two fake workers' pools, and an engine's SendKv faked
on it (succeeding or failing on demand), for the scheduler's side of moves without
worker processes.

copy_kv copies the fake slots (token and context fingerprint) from the source's blocks
into the destination's, as Worker.SendKv/ReceiveKv move K/V: the destination's fake
worker then checks, at its next step, that the sequence's positions hold its own KV;
a transfer into the wrong blocks, or of too few tokens, fails that check.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from cbserve.worker.v1 import worker_pb2 as wpb
from common.errors import ServiceError

from .fake_worker import FakeWorker

# What the fake reports per slot moved (a real worker: layers x K/V x heads x dim x dtype).
FAKE_BYTES_PER_TOKEN = 100


def copy_kv(
    source: FakeWorker,
    destination: FakeWorker,
    source_block_ids: Sequence[int],
    destination_block_ids: Sequence[int],
    num_tokens: int,
) -> None:
    assert len(source_block_ids) == len(destination_block_ids)
    size = source.block_size
    for position in range(num_tokens):
        slot = position % size
        from_block = source_block_ids[position // size]
        to_block = destination_block_ids[position // size]
        destination.kv[to_block][slot] = source.kv[from_block][slot]


class FakeSendKv:
    """Replaces one engine client's send_kv: copies between the fake workers named by
    address, or fails with `fail_with` (then copies nothing)."""

    def __init__(self, source: FakeWorker, workers: dict[str, FakeWorker]) -> None:
        self.source = source
        self.workers = workers
        self.fail_with: grpc.StatusCode | None = None
        self.calls: list[tuple[int, str, list[int], list[int], int]] = []

    async def __call__(
        self,
        transfer_id: int,
        destination: str,
        source_block_ids: list[int],
        destination_block_ids: list[int],
        num_tokens: int,
        timeout_s: float,
    ) -> wpb.SendKvReply:
        assert timeout_s > 0
        self.calls.append(
            (transfer_id, destination, source_block_ids, destination_block_ids, num_tokens)
        )
        if self.fail_with is not None:
            raise ServiceError("the fake transfer failed", self.fail_with)
        copy_kv(
            self.source,
            self.workers[destination],
            source_block_ids,
            destination_block_ids,
            num_tokens,
        )
        return wpb.SendKvReply(
            bytes_sent=num_tokens * FAKE_BYTES_PER_TOKEN, num_chunks=1, seconds=0.001
        )
