"""One measured run on a fresh server: cbserve's local stack or llama-server, speculation
off or on, the workload sent by the serving benchmark's client loop.

A fresh server per run, so that no run finds an earlier run's prompts in its prefix
cache; each server's counters are read before and after the workload (a warm-up
request comes first and is not counted).
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

from bench.harness.runner import ClientSettings, counter_growth, drive, run_rates, safe_scrape
from bench.harness.workload import BenchRequest
from bench.speculation.acceptance import CBSERVE_PREFIX, LLAMACPP_PREFIX, from_counters
from bench.speculation.report import ON, Run


def _run(workload: str, concurrency: int, system: str, speculation: str, timings, wall_s,
         grown: dict[str, float], prefix: str) -> Run:  # fmt: skip
    done = [t for t in timings if t.ok]
    return Run(
        workload=workload,
        concurrency=concurrency,
        system=system,
        speculation=speculation,
        output_tokens=sum(t.output_tokens for t in done),
        wall_s=wall_s,
        failed=len(timings) - len(done),
        acceptance=from_counters(grown, prefix),
    )


def cbserve_run(
    workload: str,
    requests: list[BenchRequest],
    settings: ClientSettings,
    speculation: str,
    worker_argv: list[str],
    scheduler_argv: list[str],
    log_dir: Path,
) -> Run:
    from cbserve.local_stack import LocalStack

    log_dir.mkdir(parents=True, exist_ok=True)
    label = f"cbserve {workload} x{settings.max_concurrency} speculation {speculation}"
    for attempt in (1, 2):  # a port picked as free can be taken before a child binds it
        log = log_dir / f"scheduler-{workload}-{settings.max_concurrency}-{speculation}.log"
        stack = LocalStack(
            worker_args=worker_argv, scheduler_args=scheduler_argv, scheduler_log=log
        )
        try:
            stack.start()
            break
        except RuntimeError as error:
            if attempt == 2:
                raise
            print(f"the stack did not start ({error}); once more", file=sys.stderr, flush=True)
    try:
        (result,) = asyncio.run(
            run_rates(stack.address, requests, [math.inf], settings, label, stack.metrics)
        )
    finally:
        stack.stop()
    return _run(
        workload,
        settings.max_concurrency,
        "cbserve",
        speculation,
        result.timings,
        result.wall_s,
        result.server_counters,
        CBSERVE_PREFIX,
    )


async def _drive_llama_server(server, requests, settings: ClientSettings, label: str):
    import aiohttp

    from bench.peers.llamacpp import stream_one
    from bench.peers.openai_stream import WARM_UP

    # As bench.peers.llamacpp: a connection per request (llama-server closes kept-alive
    # ones after a few requests), no cap on connections.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = await stream_one(session, server.url, WARM_UP, settings)
        if not warm.ok:
            raise RuntimeError(f"llama-server's warm-up request failed: {warm.error}")
        before = safe_scrape(server.metrics)
        timings, wall = await drive(
            lambda request: stream_one(session, server.url, request, settings),
            requests,
            math.inf,
            settings,
            label,
        )
        return timings, wall, counter_growth(before, safe_scrape(server.metrics))


class _MeteredLlamaServer:
    """A started llama-server with its /metrics (`--metrics`) read as parsed samples."""

    def __init__(self, server) -> None:
        self.server = server
        self.url = server.url

    def metrics(self) -> dict[str, float]:
        import urllib.request

        from common.metrics import parse_samples

        with urllib.request.urlopen(self.url + "/metrics", timeout=5.0) as response:
            return parse_samples(response.read().decode())


def llamacpp_run(
    workload: str,
    requests: list[BenchRequest],
    settings: ClientSettings,
    speculation: str,
    threads: int,
    spec_argv: list[str],
    log_dir: Path,
) -> Run:
    """llama-server as bench.peers.llamacpp starts it (the shipped GGUF, a slot per
    stream, room for the longest request in each), with `--metrics` and, for `on`,
    its own n-gram speculation flags."""
    from bench.peers import llama_server
    from cbserve.local_stack import free_port
    from common.defaults import packaged_gguf_path

    log_dir.mkdir(parents=True, exist_ok=True)
    parallel = settings.max_concurrency
    longest = max(r.prompt_len + r.max_tokens for r in requests)
    context = llama_server.context_size(parallel, longest)
    extra = ["--metrics", *(spec_argv if speculation == ON else [])]
    for attempt in (1, 2):
        port = free_port()
        argv = llama_server.server_argv(
            llama_server.binary_path(), packaged_gguf_path(), port, parallel, threads, context
        )
        log = log_dir / f"llama-server-{workload}-{parallel}-{speculation}.log"
        server = llama_server.LlamaServer(argv + extra, port, log)
        try:
            server.start()
            break
        except (RuntimeError, TimeoutError):
            if attempt == 2:
                raise
    label = f"llama.cpp {workload} x{parallel} speculation {speculation}"
    try:
        timings, wall, grown = asyncio.run(
            _drive_llama_server(_MeteredLlamaServer(server), requests, settings, label)
        )
    finally:
        server.stop()
    return _run(workload, parallel, "llama.cpp", speculation, timings, wall, grown, LLAMACPP_PREFIX)
