"""The client side of a run: send the workload to a cbserve scheduler and time every token.

One AsyncClient (one HTTP/2 channel) streams every request, as vLLM's benchmark shares
one HTTP session. Requests are sent at their arrival offsets (bench.harness.arrivals); with
--max-concurrency a semaphore holds back the rest, and a request's clock starts only
when it is really sent, so TTFT does not include time queued inside this client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from bench.harness.arrivals import describe_rate, paced, send_offsets
from bench.harness.metrics import RequestTiming
from bench.harness.progress import Progress
from bench.harness.workload import BenchRequest
from cbserve.client import AsyncClient
from cbserve.v1 import generation_pb2 as pb


@dataclass(frozen=True)
class ClientSettings:
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    progress: bool = True


@dataclass
class RateResult:
    rate: float
    timings: list[RequestTiming]
    wall_s: float
    server: dict = field(default_factory=dict)
    # How much each server counter grew during this rate (preemptions, cache hits...).
    server_counters: dict[str, float] = field(default_factory=dict)


Scrape = Callable[[], dict[str, float]]


def safe_scrape(scrape: Scrape | None) -> dict[str, float]:
    if scrape is None:
        return {}
    try:
        return scrape()
    except OSError:  # no metrics endpoint: the run is still worth reporting
        return {}


def counter_growth(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much every counter (and histogram sum and count) grew between two scrapes."""
    grown = {}
    for name, value in after.items():
        if name.split("{", 1)[0].endswith(("_total", "_sum", "_count")):
            grown[name] = value - before.get(name, 0.0)
    return grown


async def stream_one(
    client: AsyncClient, request: BenchRequest, settings: ClientSettings
) -> RequestTiming:
    timing = RequestTiming(prompt_tokens=request.prompt_len, sent_at=time.perf_counter())
    try:
        async for response in client.generate(
            token_ids=request.prompt_token_ids,
            max_tokens=request.max_tokens,
            ignore_eos=settings.ignore_eos,
            temperature=settings.temperature,
            seed=request.seed,
            **({"lora_name": request.lora_name} if request.lora_name else {}),
        ):
            if response.token_ids:
                timing.chunks.append((time.perf_counter(), len(response.token_ids)))
            if response.finish_reason:
                timing.finish_reason = pb.FinishReason.Name(response.finish_reason)
    except grpc.aio.AioRpcError as error:
        timing.error = f"{error.code().name}: {error.details()}"
    return timing


Send = Callable[[BenchRequest], Awaitable[RequestTiming]]


async def drive(
    send: Send,
    requests: list[BenchRequest],
    rate: float,
    settings: ClientSettings,
    label: str,
) -> tuple[list[RequestTiming], float]:
    """Every request through `send` (one system's streaming call) at its arrival
    offset, at most --max-concurrency at once; timings in request order, wall seconds.
    Every system of a run is driven by this one loop, so arrivals compare."""
    offsets = send_offsets(len(requests), rate, settings.burstiness, settings.seed)
    limit = (
        asyncio.Semaphore(settings.max_concurrency)
        if settings.max_concurrency
        else contextlib.nullcontext()
    )
    bar = Progress(len(requests), label) if settings.progress else None

    async def limited(request: BenchRequest) -> RequestTiming:
        async with limit:
            timing = await send(request)
        if bar:
            bar.update()
        return timing

    started = time.perf_counter()
    tasks = []
    async for request in paced(requests, offsets):
        tasks.append(asyncio.create_task(limited(request)))
    timings = await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    if bar:
        bar.close()
    return list(timings), wall


async def run_rates(
    address: str,
    requests: list[BenchRequest],
    rates: list[float],
    settings: ClientSettings,
    system: str,
    scrape: Scrape | None = None,
    api_key: str | None = None,
) -> list[RateResult]:
    """Every rate, one after another, on one connection to one server; `scrape` reads
    the server's metrics, before and after each rate."""
    # No client retries: the benchmark counts what the server answered, refusals included.
    # The key only when given, as the `authorization` metadata (cbserve.Client's api_key).
    keyed = {"api_key": api_key} if api_key else {}
    async with AsyncClient(address, retry=None, **keyed) as client:
        info = await client.model_info(timeout=30.0)
        server = {
            "model": info.model_name,
            "num_workers": info.num_workers,
            "kv_capacity_tokens": info.kv_capacity_tokens,
        }
        # One short request first: the first step pays one-time costs that are no
        # part of serving (allocator growth, lazy imports, thread pools). Its prompt is
        # shorter than a KV block, so it leaves nothing in the prefix cache that a
        # workload prompt could hit (vLLM warms up with the first workload prompt).
        await client.complete(prompt="Warm-up.", max_tokens=4, temperature=0, timeout=120)
        results = []
        for rate in rates:
            label = f"{system}, {describe_rate(rate, settings.burstiness)}"
            before = safe_scrape(scrape)
            send = functools.partial(stream_one, client, settings=settings)
            timings, wall = await drive(send, requests, rate, settings, label)
            grown = counter_growth(before, safe_scrape(scrape))
            results.append(RateResult(rate, timings, wall, server, grown))
    return results


def short_outputs(requests: list[BenchRequest], timings: list[RequestTiming]) -> list[tuple]:
    """(request, got, asked) where a completed request did not produce max_tokens."""
    return [
        (r.index, t.output_tokens, r.max_tokens)
        for r, t in zip(requests, timings, strict=True)
        if t.ok and t.output_tokens != r.max_tokens
    ]
