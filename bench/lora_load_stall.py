"""`cbserve bench lora-load-stall`: what loading a LoRA adapter at run time costs the
streams already running (issue 43: at most one step).

A local stack with --enable-lora serves N streams on the base; once they decode, the
adapter is loaded over HTTP (`POST /v1/load_lora_adapter`, the scheduler reads it, one
worker loads it into a slot beside its steps) and, once loaded, used by one request.
Every token's arrival is timed on every stream. Printed: the streams' median gap
between tokens (one step), the largest gap while the load ran (from the POST to its
answer, plus one step), and that gap in steps, beside the largest gap of the same
length of time before the load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

from cbserve.client import Client
from cbserve.local_stack import LocalStack


def _stream(client: Client, index: int, max_tokens: int, arrivals: list[float]) -> None:
    prompt = f"Write a long story about the city number {index} and its rivers."
    for _ in client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
        arrivals.append(time.monotonic())


def _post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.read().decode()


def _largest_gap(arrivals: list[list[float]], start: float, stop: float) -> float:
    """The longest wait for a next token that any stream had, over waits ending in
    [start, stop]."""
    largest = 0.0
    for times in arrivals:
        for before, after in zip(times, times[1:], strict=False):
            if start <= after <= stop:
                largest = max(largest, after - before)
    return largest


def measure(args: argparse.Namespace) -> dict[str, float]:
    worker_args = ["--enable-lora", "--max-cpu-loras", "2", "--threads", str(args.threads)]
    stack = LocalStack(
        worker_args=worker_args,
        scheduler_args=["--enable-lora", "--max-cpu-loras", "2"],
        http_port=0,
    )
    with stack, Client(stack.address) as client:
        arrivals: list[list[float]] = [[] for _ in range(args.streams)]
        threads = [
            threading.Thread(target=_stream, args=(client, i, args.max_tokens, arrivals[i]))
            for i in range(args.streams)
        ]
        for thread in threads:
            thread.start()
        time.sleep(args.warmup_s)
        load_start = time.monotonic()
        status, text = _post(
            f"{stack.http_url}/v1/load_lora_adapter",
            {"lora_name": "stall", "lora_path": args.adapter},
        )
        load_stop = time.monotonic()
        used = list(client.generate("Hello", max_tokens=4, lora_name="stall"))
        for thread in threads:
            thread.join()
    if status != 200 or not used:
        raise SystemExit(f"the load did not work: {status} {text}")
    gaps = [b - a for times in arrivals for a, b in zip(times, times[1:], strict=False)]
    step = statistics.median(gaps)
    window = load_stop - load_start + step
    during = _largest_gap(arrivals, load_start, load_start + window)
    before = _largest_gap(arrivals, load_start - window, load_start)
    return {
        "streams": args.streams,
        "median_gap_ms": step * 1e3,
        "load_s": load_stop - load_start,
        "largest_gap_during_load_ms": during * 1e3,
        "largest_gap_before_load_ms": before * 1e3,
        "largest_gap_during_load_steps": during / step,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True, help="a PEFT directory (make-adapters)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--warmup-s", type=float, default=4.0, help="decoding before the load")
    parser.add_argument("--threads", type=int, default=2, help="the worker's threads")
    result = measure(parser.parse_args(argv))
    for name, value in result.items():
        print(f"{name}: {value:.2f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
