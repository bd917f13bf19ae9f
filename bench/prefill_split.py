"""`cbserve bench prefill-split`: what long prompts arriving do to the streams already
decoding, with prefill apart from decode against colocated workers (issue 46, item 4:
the streams' P99 gap between tokens at most half, at no more than 10% less throughput).

Two local stacks of two workers each (`--threads 1` each by default), one after the
other: `colocated` (two --worker workers) and `split` (one --worker decode worker and one
--prefill-worker). On each, N streams (short prompts, greedy, ignore_eos) start and
decode; once every one has its first tokens, and --steady-s more seconds (the streams'
throughput alone), four prompts of 2,000 tokens (distinct token ids: no prefix hit)
arrive at once, each for a few tokens. The window runs from
their arrival until the last of them ends (plus --tail-s); then the streams are
cancelled. Printed per mode: the streams' P50/P99/max gap between tokens over the gaps
ending in the window, the tokens per second of every request in the window, and the
long prompts' time to first token; then the split's ratios against colocated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from cbserve.client import AsyncClient
from cbserve.local_stack import LocalStack

MODES = {"colocated": 0, "split": 1}


async def _stream(client: AsyncClient, index: int, max_tokens: int, arrivals: list) -> None:
    prompt = f"Write a long story about the city number {index} and its rivers."
    async for response in client.generate(
        prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True
    ):
        now = time.monotonic()
        arrivals.extend([now] * len(response.token_ids))


async def _long(client: AsyncClient, index: int, length: int, max_tokens: int, arrivals: list):
    # Distinct per prompt from its first token on: no prefix-cache hit between them.
    token_ids = [100 + (index * 7919 + position * 31) % 40000 for position in range(length)]
    sent = time.monotonic()
    first = None
    async for response in client.generate(
        token_ids=token_ids, max_tokens=max_tokens, temperature=0.0, ignore_eos=True
    ):
        now = time.monotonic()
        first = first if first is not None else now
        arrivals.extend([now] * len(response.token_ids))
    return first - sent


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _drive(address: str, args: argparse.Namespace) -> dict[str, float]:
    async with AsyncClient(address) as client:
        streams = [[] for _ in range(args.streams)]
        tasks = [
            asyncio.create_task(_stream(client, i, args.stream_max_tokens, streams[i]))
            for i in range(args.streams)
        ]
        while not all(len(times) >= args.warmup_tokens for times in streams):
            if any(task.done() for task in tasks):
                raise SystemExit("a stream ended during the warm-up: raise --stream-max-tokens")
            await asyncio.sleep(0.05)
        # The streams alone first: their steady throughput, before any long prompt.
        steady_from = time.monotonic()
        await asyncio.sleep(args.steady_s)
        steady_to = time.monotonic()
        longs = [[] for _ in range(args.long_prompts)]
        start = time.monotonic()
        ttfts = await asyncio.gather(
            *(
                _long(client, i, args.long_tokens, args.long_max_tokens, longs[i])
                for i in range(args.long_prompts)
            )
        )
        await asyncio.sleep(args.tail_s)
        stop = time.monotonic()
        if any(task.done() for task in tasks):
            raise SystemExit("a stream ended inside the window: raise --stream-max-tokens")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    gaps = [
        after - before
        for times in streams
        for before, after in zip(times, times[1:], strict=False)
        if start <= after <= stop and after > before
    ]
    tokens = sum(start <= t <= stop for times in (*streams, *longs) for t in times)
    steady = sum(steady_from <= t <= steady_to for times in streams for t in times)
    return {
        "window_s": stop - start,
        "gap_p50_ms": statistics.median(gaps) * 1e3,
        "gap_p99_ms": _percentile(gaps, 0.99) * 1e3,
        "gap_max_ms": max(gaps) * 1e3,
        "tokens_per_s": tokens / (stop - start),
        "steady_tokens_per_s": steady / (steady_to - steady_from),
        "long_ttft_max_s": max(ttfts),
    }


def measure(mode: str, args: argparse.Namespace) -> dict[str, float]:
    dtype = ["--dtype", args.dtype] if args.dtype else []
    stack = LocalStack(
        num_workers=2,
        num_prefill_workers=MODES[mode],
        worker_args=["--threads", str(args.threads), *dtype],
        metrics_port=None,
    )
    with stack:
        return asyncio.run(_drive(stack.address, args))


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--stream-max-tokens", type=int, default=2000)
    parser.add_argument("--warmup-tokens", type=int, default=4, help="each stream's, first")
    parser.add_argument("--steady-s", type=float, default=5.0, help="streams alone, first")
    parser.add_argument("--long-prompts", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=2000)
    parser.add_argument("--long-max-tokens", type=int, default=8)
    parser.add_argument("--tail-s", type=float, default=1.0, help="window after the last")
    parser.add_argument("--threads", type=int, default=1, help="each worker's threads")
    parser.add_argument("--dtype", default=None, help="the workers' --dtype (default: theirs)")
    parser.add_argument("--modes", default="colocated,split", help="comma-separated")
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    results = {}
    for mode in args.modes.split(","):
        results[mode] = measure(mode, args)
        row = ", ".join(f"{name} {value:.2f}" for name, value in results[mode].items())
        print(f"{mode}: {row} (load average {os.getloadavg()[0]:.2f})", flush=True)
    if {"colocated", "split"} <= results.keys():
        colocated, split = results["colocated"], results["split"]

        def ratio(name: str) -> float:
            return split[name] / colocated[name]

        print(
            f"split / colocated: P99 gap {ratio('gap_p99_ms'):.2f}x, throughput "
            f"{ratio('tokens_per_s'):.2f}x (streams alone: {ratio('steady_tokens_per_s'):.2f}x)"
        )


if __name__ == "__main__":
    main()
