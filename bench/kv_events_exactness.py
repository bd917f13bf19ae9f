"""KV events against the scheduler's own prefix caches, over real ZeroMQ sockets.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kv_events_exactness [--requests 1000]

Three replicas, each of two workers: real Schedulers on the fake worker
(tests/scheduler), pools small enough that cached blocks are evicted all along. Each
replica publishes through its own ZmqEventPublisher (tcp://127.0.0.1, a replay socket),
and one subscriber per replica (a SUB socket, gaps filled from the replay socket)
rebuilds what the replica caches from the events alone. Requests are conversations that
grow turn by turn (prefix hits) and unique prompts, placed on a replica's worker by
conversation; one worker of each replica is lost halfway (its cache withdrawn, a new
empty one in its place). Printed: per replica, whether the subscriber's set of cached
blocks equals the union of its workers' block managers, block for block, after every
wave and at the end.
"""

from __future__ import annotations

import argparse
import random
import time

from scheduler_svc.config.kv_events import KVEventsConfig
from scheduler_svc.kv_events.publisher import ZmqEventPublisher
from scheduler_svc.kv_events.replica import ReplicaKVEvents
from scheduler_svc.kv_events.wire import wire_hash
from tests.kv_events.zmq_client import ReplayingSubscriber
from tests.scheduler.harness import Harness, make_request, unique_prompt

NUM_REPLICAS, WORKERS_PER_REPLICA = 3, 2


def _worker() -> Harness:
    return Harness(num_blocks=64, block_size=4, max_num_batched_tokens=64, async_scheduling=True)


class Replica:
    def __init__(self, index: int) -> None:
        self.publisher = ZmqEventPublisher(
            KVEventsConfig(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint="tcp://127.0.0.1:*",
                replay_endpoint="tcp://127.0.0.1:*",
                topic=f"kv@127.0.0.1:{8000 + index}@SmolLM2-135M-Instruct",
            )
        )
        self.events = ReplicaKVEvents(self.publisher.publish)
        self.workers = [self._attached(_worker()) for _ in range(WORKERS_PER_REPLICA)]
        self.subscriber = ReplayingSubscriber(
            self.publisher.endpoint, self.publisher.replay_endpoint
        )
        self.subscriber.connect()
        self.requests = 0

    def _attached(self, worker: Harness) -> Harness:
        worker.block_manager.events = self.events
        return worker

    def lose_worker(self, index: int) -> None:
        """The worker's KV is gone: its cache withdrawn, an empty one in its place."""
        old = self.workers[index].block_manager
        old.events = None
        self.events.withdraw(old.cached_block_hashes())
        self.workers[index] = self._attached(_worker())

    def cached(self) -> set[int]:
        held: set[int] = set()
        for worker in self.workers:
            held |= {wire_hash(h) for h in worker.block_manager.cached_block_hashes()}
        return held

    def matches(self, timeout_s: float = 10.0) -> bool:
        self.events.flush()
        want = self.cached()
        view = self.subscriber.view
        self.subscriber.drain_until(
            lambda: view.next_seq == self.publisher.num_sent and view.blocks == want, timeout_s
        )
        return view.blocks == want


def main(argv: list[str] | None = None, prog: str = "python -m bench.kv_events_exactness") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    replicas = [Replica(index) for index in range(NUM_REPLICAS)]
    system = unique_prompt(12)
    conversations = [list(system) for _ in range(24)]
    started = time.perf_counter()
    checks = 0
    for number in range(args.requests):
        conversation = rng.randrange(len(conversations) + 8)
        if conversation < len(conversations):
            turn = conversations[conversation]
            turn.extend(unique_prompt(rng.randrange(4, 20)))
            if len(turn) > 200:
                del turn[len(system) :]
            prompt = list(turn)
        else:
            prompt = unique_prompt(rng.randrange(8, 60))
        replica = replicas[conversation % NUM_REPLICAS]
        worker = replica.workers[(conversation // NUM_REPLICAS) % WORKERS_PER_REPLICA]
        worker.add(make_request(prompt, max_tokens=rng.randrange(1, 16), ignore_eos=True))
        replica.requests += 1
        for _ in range(rng.randrange(0, 3)):
            worker.step()
            replica.events.flush()  # one batch per step, as the engines' loop gives
        if number == args.requests // 2:
            for replica in replicas:
                replica.lose_worker(0)
        # Each subscriber is away for a stretch: what it misses comes from the replay.
        if number == args.requests // 3:
            for replica in replicas:
                replica.subscriber.close()
        if number == args.requests // 3 + 60:
            for replica in replicas:
                replica.subscriber.connect()
        if number % 25 == 24 and not args.requests // 3 <= number < args.requests // 3 + 60:
            for replica in replicas:
                assert replica.matches(), "the subscriber's view differs from the scheduler's"
                checks += 1
    for replica in replicas:
        for worker in replica.workers:
            while worker.step() is not None:
                replica.events.flush()
    elapsed = time.perf_counter() - started
    print(f"{args.requests} requests over {NUM_REPLICAS} replicas x {WORKERS_PER_REPLICA} workers")
    for index, replica in enumerate(replicas):
        equal = replica.matches()
        view = replica.subscriber.view
        preempted = sum(w.scheduler.stats.num_preemptions for w in replica.workers)
        print(
            f"replica {index}: requests={replica.requests} batches={view.next_seq} "
            f"(live {replica.subscriber.num_live}, replayed {replica.subscriber.num_replayed}) "
            f"stored={view.num_stored} removed={view.num_removed} cleared={view.num_cleared} "
            f"cached_now={len(view.blocks)} preemptions={preempted} "
            f"equal_block_for_block={equal}"
        )
        replica.subscriber.close()
        replica.publisher.shutdown()
    print(f"wave checks passed: {checks}; wall {elapsed:.1f}s")


if __name__ == "__main__":
    main()
