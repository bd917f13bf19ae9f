"""A mixed run of the real Scheduler on the fake worker with KV events on, the events
going through the wire encoding and a subscriber's decoding at every flush.

The mix: multi-turn conversations that share a system prompt and grow turn by turn
(prefix hits), prompts no other request shares, and a few requests aborted mid-run, in
a pool small enough that cached blocks are evicted all along. After every wave the
subscriber's view is compared with the block manager's own prefix cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from scheduler_svc.kv_events.replica import ReplicaKVEvents
from scheduler_svc.kv_events.wire import encode_batch, wire_hash
from tests.kv_events.subscriber import CacheView, decode_message
from tests.scheduler.harness import Harness, make_request, unique_prompt

TOPIC = b"kv@10.0.0.7:8000@SmolLM2-135M-Instruct"


@dataclass
class WireSubscriber:
    """The replica's publish callback: each batch numbered, encoded, decoded, applied."""

    view: CacheView = field(default_factory=CacheView)
    num_batches: int = 0

    def publish(self, ts: float, events: list) -> None:
        frames = [TOPIC, self.num_batches.to_bytes(8, "big"), encode_batch(ts, events)]
        self.num_batches += 1
        message = decode_message(frames)
        assert message.topic == TOPIC and message.dp_rank == 0
        self.view.apply(message)


def attach(harness: Harness) -> tuple[ReplicaKVEvents, WireSubscriber]:
    subscriber = WireSubscriber()
    replica = ReplicaKVEvents(subscriber.publish)
    harness.block_manager.events = replica
    return replica, subscriber


def scheduler_view(harness: Harness) -> set[int]:
    return {wire_hash(h) for h in harness.block_manager.cached_block_hashes()}


@dataclass
class RunStats:
    requests: int = 0
    checks: int = 0


def mixed_run(
    harness: Harness,
    replica: ReplicaKVEvents,
    subscriber: WireSubscriber,
    num_requests: int,
    seed: int = 0,
    wave: int = 12,
) -> RunStats:
    """Submits num_requests in waves of `wave`, stepping a few times between arrivals;
    after each wave's steps the subscriber's view must equal the scheduler's."""
    rng = random.Random(seed)
    system = unique_prompt(9)
    conversations: list[list[int]] = [list(system) for _ in range(6)]
    stats = RunStats()
    submitted: list[str] = []
    while stats.requests < num_requests:
        for _ in range(min(wave, num_requests - stats.requests)):
            kind = rng.random()
            if kind < 0.5:
                turn = conversations[rng.randrange(len(conversations))]
                turn.extend(unique_prompt(rng.randrange(3, 12)))
                if len(turn) > 150:  # a conversation that grew too long starts over
                    del turn[len(system) :]
                prompt = list(turn)
            else:
                prompt = unique_prompt(rng.randrange(5, 40))
            request = make_request(prompt, max_tokens=rng.randrange(1, 12), ignore_eos=True)
            harness.add(request)
            submitted.append(request.request_id)
            stats.requests += 1
        for _ in range(rng.randrange(1, 6)):
            harness.step()
        if rng.random() < 0.2 and submitted:
            victim = submitted[rng.randrange(len(submitted))]
            if not harness.finished(victim):
                harness.scheduler.abort_request(victim)
        replica.flush()
        assert subscriber.view.blocks == scheduler_view(harness)
        stats.checks += 1
    harness.run(max_steps=100_000)
    replica.flush()
    assert subscriber.view.blocks == scheduler_view(harness)
    stats.checks += 1
    return stats
