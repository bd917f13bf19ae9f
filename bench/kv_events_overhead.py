"""What KV events cost the step loop: the same in-process run with events off and on.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kv_events_overhead [--requests 1000] [--rounds 3]

A real Scheduler on the fake worker (tests/scheduler) runs the same request mix
(conversations with prefix hits, unique prompts, a pool that evicts all along) with
no events, then with a ReplicaKVEvents feeding a real ZmqEventPublisher (its thread
encodes and sends; a batch per step handed over as the engine's loop does), the two
alternated `rounds` times. Printed: microseconds per step of the whole loop (schedule,
the fake worker, update; for "on" also the block managers' reports, the per-step
hand-over and the publisher thread's competition for the interpreter), each round's and
the median, and the time spent inside the events' calls on the loop thread (timed per
call). The fake worker's share, the same in both, is most of a step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from scheduler_svc.config.kv_events import KVEventsConfig
from scheduler_svc.kv_events.publisher import ZmqEventPublisher
from scheduler_svc.kv_events.replica import ReplicaKVEvents
from tests.scheduler.harness import Harness, make_request, unique_prompt


def _prompts(count: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    system = unique_prompt(32)
    conversations = [list(system) for _ in range(16)]
    mix = []
    for _ in range(count):
        pick = rng.randrange(len(conversations) + 6)
        if pick < len(conversations):
            turn = conversations[pick]
            turn.extend(unique_prompt(rng.randrange(8, 40)))
            if len(turn) > 400:
                del turn[len(system) :]
            mix.append((list(turn), rng.randrange(4, 32)))
        else:
            mix.append((unique_prompt(rng.randrange(16, 200)), rng.randrange(4, 32)))
    return mix


class _Timed:
    """The replica's methods, each call timed: the loop thread's own share of events."""

    def __init__(self, replica: ReplicaKVEvents) -> None:
        self.replica = replica
        self.seconds = 0.0

    def _timed(self, method, *args) -> None:
        started = time.perf_counter()
        method(*args)
        self.seconds += time.perf_counter() - started

    def stored(self, *args) -> None:
        self._timed(self.replica.stored, *args)

    def removed(self, *args) -> None:
        self._timed(self.replica.removed, *args)

    def flush(self) -> None:
        self._timed(self.replica.flush)


def _run(mix, events_on: bool) -> tuple[float, int, float]:
    harness = Harness(
        num_blocks=256, block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
        max_model_len=2048, async_scheduling=True,
    )  # fmt: skip
    publisher = replica = None
    if events_on:
        publisher = ZmqEventPublisher(
            KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:*")
        )
        replica = _Timed(ReplicaKVEvents(publisher.publish))
        harness.block_manager.events = replica
    steps = 0
    started = time.perf_counter()
    for index, (prompt, max_tokens) in enumerate(mix):
        harness.add(make_request(prompt, max_tokens=max_tokens, ignore_eos=True))
        if index % 4 == 3:
            for _ in range(4):
                if harness.step() is not None:
                    steps += 1
                if replica is not None:
                    replica.flush()
    while harness.step() is not None:
        steps += 1
        if replica is not None:
            replica.flush()
    elapsed = time.perf_counter() - started
    if publisher is not None:
        publisher.shutdown()
    return elapsed, steps, replica.seconds if replica is not None else 0.0


def main(argv: list[str] | None = None, prog: str = "python -m bench.kv_events_overhead") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    mix = _prompts(args.requests, seed=0)
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    in_events: list[float] = []
    for round_index in range(args.rounds):
        for mode in ("off", "on"):
            elapsed, steps, events_s = _run(mix, mode == "on")
            per_step[mode].append(elapsed / steps)
            if mode == "on":
                in_events.append(events_s / steps)
            print(f"round {round_index} events {mode}: {steps} steps, {elapsed:.2f}s, "
                  f"{elapsed / steps * 1e6:.0f} us/step"
                  + (f", {events_s / steps * 1e6:.1f} us/step in the events' calls"
                     if mode == "on" else ""))  # fmt: skip
    off, on = statistics.median(per_step["off"]), statistics.median(per_step["on"])
    inside = statistics.median(in_events) * 1e6
    change = (on / off - 1) * 100
    print(f"median us/step: off {off * 1e6:.0f}, on {on * 1e6:.0f} ({change:+.1f}%); "
          f"in the events' calls on the loop thread {inside:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
