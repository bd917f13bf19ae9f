"""The runs behind `cbserve bench drain` (bench/drain.py): the same streams without and
with a drain, and prompts of the same length sent alone (one recompute's time).

Every stream's prompt is its own token ids from the first on (no prefix shared between
streams, none with the probes), decoded greedily for a fixed number of tokens; each
response's arrival is timed on the client (time.monotonic, the clock the scheduler's
log uses too, so the two compare on one host).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import grpc

from cbserve.client import AsyncClient
from cbserve.v1 import admin_pb2, admin_pb2_grpc
from common.metrics import parse_samples

RUNNING_SAMPLE = re.compile(r'^cbserve_worker_num_requests_running\{worker="([^"]+)"\}$')
# Long enough for 16 prompts of thousands of tokens on one-thread workers.
STREAM_TIMEOUT_S = 900.0


def prompt_token_ids(index: int, length: int) -> list[int]:
    """Prompt `index`: distinct from every other index's from its first token on."""
    return [100 + (index * 7919 + position * 31) % 40000 for position in range(length)]


@dataclass
class Stream:
    """One stream's tokens and the arrival of each response that carried some."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)

    def gaps(self) -> list[tuple[float, float]]:
        """(previous arrival, arrival) of every response after the first."""
        return list(zip(self.arrivals, self.arrivals[1:], strict=False))


@dataclass
class DrainCall:
    worker: str
    running_before: dict[str, float]
    started: float
    ended: float
    reply: admin_pb2.DrainWorkerResponse


async def _stream(client: AsyncClient, stream: Stream, prompt: list[int], max_tokens: int):
    async for response in client.generate(
        token_ids=prompt,
        request_id=stream.request_id,
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        timeout=STREAM_TIMEOUT_S,
    ):
        if response.token_ids:
            stream.arrivals.append(time.monotonic())
            stream.token_ids.extend(response.token_ids)


def running_per_worker(metrics: dict[str, float]) -> dict[str, float]:
    """The scheduler's running requests per worker address, from its metrics."""
    running = {}
    for sample, value in metrics.items():
        match = RUNNING_SAMPLE.match(sample)
        if match:
            running[match.group(1)] = value
    return running


async def _metrics(url: str) -> dict[str, float]:
    def read() -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(url, timeout=10) as response:
            return parse_samples(response.read().decode())

    return await asyncio.to_thread(read)


async def run_streams(
    address: str,
    metrics_url: str,
    label: str,
    num_streams: int,
    prompt_tokens: int,
    max_tokens: int,
    drain_after_tokens: int | None,
) -> tuple[list[Stream], DrainCall | None]:
    """num_streams streams at once; with drain_after_tokens, once every one has that
    many tokens, DrainWorker on the worker running the most of them."""
    streams = [Stream(f"{label}-{index}") for index in range(num_streams)]
    drain = None
    async with AsyncClient(address) as client:
        tasks = [
            asyncio.create_task(
                _stream(client, stream, prompt_token_ids(index, prompt_tokens), max_tokens)
            )
            for index, stream in enumerate(streams)
        ]
        if drain_after_tokens is not None:
            while not all(len(s.token_ids) >= drain_after_tokens for s in streams):
                if any(task.done() for task in tasks):
                    await asyncio.gather(*tasks)  # a failure raises here
                    raise SystemExit("a stream ended before the drain: raise --max-tokens")
                await asyncio.sleep(0.02)
            drain = await _drain_busiest(address, metrics_url)
        await asyncio.gather(*tasks)
    return streams, drain


async def _drain_busiest(address: str, metrics_url: str) -> DrainCall:
    running = running_per_worker(await _metrics(metrics_url))
    worker = max(sorted(running), key=lambda address: running[address])
    async with grpc.aio.insecure_channel(address) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        started = time.monotonic()
        reply = await admin.DrainWorker(
            admin_pb2.DrainWorkerRequest(address=worker), timeout=STREAM_TIMEOUT_S
        )
        ended = time.monotonic()
    return DrainCall(worker, running, started, ended, reply)


async def recompute_seconds(
    address: str, first_index: int, prompt_tokens: int, probes: int
) -> list[float]:
    """The time to first token of `probes` prompts of prompt_tokens (their own token ids:
    nothing cached), each sent alone: what recomputing such a prompt costs."""
    seconds = []
    async with AsyncClient(address) as client:
        for index in range(first_index, first_index + probes):
            sent, first = time.monotonic(), None
            async for _ in client.generate(
                token_ids=prompt_token_ids(index, prompt_tokens),
                max_tokens=1,
                temperature=0.0,
                timeout=STREAM_TIMEOUT_S,
            ):
                first = first if first is not None else time.monotonic()
            seconds.append(first - sent)
    return seconds
