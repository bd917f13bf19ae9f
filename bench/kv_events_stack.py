"""KV events from a real scheduler process: 1,000 requests with evictions, a real SUB socket.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kv_events_stack [--requests 1000] [--api-processes 0]

A LocalStack with one null worker (real token ids, simulated step times, a pool of
--blocks blocks) and --kv-events-config; a subscriber thread rebuilds the replica's
prefix cache from the events (gaps filled from the replay socket), checking the wire
format, the hash chains and the gap-free numbers as it goes. The scheduler's set of
hashes is not visible from outside, so at the end, idle, the subscriber's count of
cached blocks is compared with the scheduler's cbserve_kv_blocks_cached (idle, every
cached block is a free one), and its block size and numbers with the stream's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time

from cbserve.client import AsyncClient
from cbserve.local_stack import LocalStack, free_port
from tests.integration.stacks import wait_until_idle
from tests.kv_events.zmq_client import ReplayingSubscriber


async def _send(address: str, prompts: list[list[int]], concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    queue: asyncio.Queue = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def one_client() -> None:
        async with AsyncClient(address) as client:
            while not queue.empty():
                prompt = queue.get_nowait()
                await client.complete(
                    token_ids=prompt, max_tokens=rng.randrange(1, 24), ignore_eos=True
                )

    await asyncio.gather(*(one_client() for _ in range(concurrency)))


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    fresh = iter(range(100, 10**6))
    system = [next(fresh) % 40000 + 100 for _ in range(40)]
    conversations = [list(system) for _ in range(24)]
    prompts = []
    for _ in range(count):
        pick = rng.randrange(len(conversations) + 8)
        if pick < len(conversations):
            turn = conversations[pick]
            turn.extend(next(fresh) % 40000 + 100 for _ in range(rng.randrange(8, 60)))
            if len(turn) > 700:
                del turn[len(system) :]
            prompts.append(list(turn))
        else:
            prompts.append([next(fresh) % 40000 + 100 for _ in range(rng.randrange(20, 200))])
    return prompts


def main(argv: list[str] | None = None, prog: str = "python -m bench.kv_events_stack") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=128)
    parser.add_argument("--api-processes", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pub_port, replay_port, http_port = free_port(), free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": f"kv@127.0.0.1:{http_port}@SmolLM2-135M-Instruct",
    }
    scheduler_args = ["--kv-events-config", json.dumps(config)]
    if args.api_processes:
        scheduler_args += ["--api-processes", str(args.api_processes)]
    stack = LocalStack(
        worker_args=[
            "--model-impl",
            "null",
            "--null-step-ms",
            "1",
            "--num-kv-blocks",
            str(args.blocks),
        ],
        scheduler_args=scheduler_args,
        http_port=http_port,
    )
    with stack:
        subscriber = ReplayingSubscriber(
            f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
        )
        subscriber.connect()
        done = threading.Event()
        reader = threading.Thread(
            target=subscriber.drain_until, args=(done.is_set, 3600.0), daemon=True
        )
        reader.start()
        started = time.perf_counter()
        asyncio.run(
            _send(stack.address, _prompts(args.requests, args.seed), args.concurrency, args.seed)
        )
        elapsed = time.perf_counter() - started
        metrics = wait_until_idle(stack)
        time.sleep(0.5)  # the last batches leave the publisher thread
        done.set()
        reader.join()
        subscriber.replay()  # anything still missing, up to the last batch kept
        view = subscriber.view
        cached = int(metrics["cbserve_kv_blocks_cached"])
        print(
            f"{args.requests} requests (concurrency {args.concurrency}, pool {args.blocks} blocks, "
            f"api processes {args.api_processes}) in {elapsed:.1f}s"
        )
        print(
            f"batches={view.next_seq} live={subscriber.num_live} "
            f"replayed={subscriber.num_replayed} "
            f"stored={view.num_stored} removed={view.num_removed} cleared={view.num_cleared}"
        )
        print(
            f"subscriber holds {len(view.blocks)} blocks; scheduler's cbserve_kv_blocks_cached="
            f"{cached}; prefix-cache hit tokens={int(metrics['cbserve_prefix_cache_hits_total'])}; "
            f"equal={len(view.blocks) == cached}"
        )
        subscriber.close()


if __name__ == "__main__":
    main()
