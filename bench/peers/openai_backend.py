"""`cbserve bench --backend openai --base-url URL`: the benchmark's workload through any
OpenAI-compatible server's streaming /v1/completions, so that cbserve's HTTP front,
llama-server or vLLM are measured by the same client loop as cbserve's gRPC API.

The same requests as the gRPC backend sends (prompt token ids, max_tokens, greedy,
`ignore_eos` where the server accepts it), driven by bench.harness.runner.drive, timed by
bench.peers.openai_stream. One aiohttp session serves every rate and keeps its connections
alive, as the gRPC backend keeps one channel: what is measured is the server, not TCP
connection set-up. The column is named after the URL, and results.json records it.
"""

from __future__ import annotations

import asyncio
import sys

from bench.harness.arrivals import describe_rate
from bench.harness.results import Column, column_label
from bench.harness.runner import (
    ClientSettings,
    RateResult,
    Scrape,
    counter_growth,
    drive,
    safe_scrape,
)
from bench.peers.openai_stream import WARM_UP, openai_completion_body, stream_completion

SYSTEM = "openai"


def api_root(base_url: str) -> str:
    """The URL that /completions and /models hang from: base_url with one /v1 at the end,
    whether the user gave it (as the openai SDK wants) or not (as vLLM's bench does)."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def served_model(session, root: str, headers: dict[str, str]) -> str | None:
    """The first model the server lists, or None when it lists none or has no /models
    (then no `model` field is sent; llama-server takes requests without one)."""
    import aiohttp

    try:
        async with session.get(root + "/models", headers=headers) as response:
            if response.status != 200:
                return None
            listed = (await response.json(content_type=None)).get("data") or []
    except (aiohttp.ClientError, ValueError, AttributeError):
        return None
    return listed[0].get("id") if listed and isinstance(listed[0], dict) else None


async def run_rates(
    base_url: str,
    requests,
    rates: list[float],
    settings: ClientSettings,
    model: str | None = None,
    api_key: str | None = None,
    scrape: Scrape | None = None,
) -> list[RateResult]:
    """Every rate in turn against one server; raises RuntimeError when the warm-up
    request fails (wrong URL, wrong key, no such model), before anything is timed."""
    import aiohttp

    root = api_root(base_url)
    headers = auth_headers(api_key)
    # No cap on connections (aiohttp's default is 100): each request in flight has one.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = model or await served_model(session, root, headers)

        async def send(request):
            body = openai_completion_body(request, settings.temperature, settings.ignore_eos, model)
            return await stream_completion(
                session, root + "/completions", body, request.prompt_len, headers
            )

        warm = await send(WARM_UP)
        if not warm.ok:
            raise RuntimeError(f"the warm-up request to {root}/completions failed: {warm.error}")
        server = {"backend": SYSTEM, "base_url": root, "model": model}
        results = []
        for rate in rates:
            label = f"{SYSTEM} {root}, {describe_rate(rate, settings.burstiness)}"
            before = safe_scrape(scrape)
            timings, wall = await drive(send, requests, rate, settings, label)
            grown = counter_growth(before, safe_scrape(scrape))
            results.append(RateResult(rate, timings, wall, dict(server), grown))
    return results


def columns(args, requests, settings: ClientSettings, scrape: Scrape | None) -> list[Column]:
    """The measured system's columns for `cbserve bench --backend openai`."""
    root = api_root(args.base_url)
    print(f"measuring {root} (--backend openai) ...", file=sys.stderr, flush=True)
    outcomes = asyncio.run(
        run_rates(
            args.base_url,
            requests,
            args.request_rate,
            settings,
            args.served_model_name,
            args.api_key,
            scrape,
        )
    )
    system = f"{SYSTEM} {root}"
    return [
        Column(
            column_label(system, r.rate, args.request_rate),
            SYSTEM,
            r.rate,
            r.timings,
            r.wall_s,
            {**r.server, "server_counters": r.server_counters},
        )
        for r in outcomes
    ]
