"""`cbserve bench --backend openai`: the workload through a real local HTTP server that
speaks the OpenAI streaming completions shape (chunks with text, a finish_reason, then
a usage chunk with no choices, then [DONE]), with a key, /v1/models and a bad request."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from bench.harness.runner import ClientSettings
from bench.harness.workload import BenchRequest
from bench.peers import openai_backend
from bench.serving import options, serve

KEY = "test-key"
MODEL = "served-model"
REQUESTS = [
    BenchRequest(index=i, prompt_token_ids=[5 + i, 6, 7], max_tokens=3 + i, seed=i)
    for i in range(4)
]


class OpenAIServer:
    """aiohttp on a free port in a thread of its own (the code under test runs its own
    event loop); records every completions body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _completions(self, request):
        from aiohttp import web

        if request.headers.get("Authorization") != f"Bearer {KEY}":
            error = {"message": "bad key", "type": "invalid_request_error", "code": 401}
            return web.json_response({"error": error}, status=401)
        body = await request.json()
        self.bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        count = body["max_tokens"]
        for index in range(count):
            reason = "length" if index == count - 1 else None
            choice = {"index": 0, "text": f"t{index}", "finish_reason": reason}
            chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.002)
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": count}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
def server():
    with OpenAIServer() as running:
        yield running


def test_api_root_takes_the_url_with_or_without_v1():
    assert openai_backend.api_root("http://h:8000") == "http://h:8000/v1"
    assert openai_backend.api_root("http://h:8000/v1/") == "http://h:8000/v1"


@pytest.mark.parametrize("suffix", ["", "/v1"])
def test_the_workload_streams_through_the_completions_api(server, suffix):
    settings = ClientSettings(max_concurrency=2, progress=False)
    (result,) = asyncio.run(
        openai_backend.run_rates(server.url + suffix, REQUESTS, [math.inf], settings, api_key=KEY)
    )
    assert [t.output_tokens for t in result.timings] == [r.max_tokens for r in REQUESTS]
    assert all(t.ok and t.finish_reason == "LENGTH" for t in result.timings)
    assert result.server == {"backend": "openai", "base_url": server.url + "/v1", "model": MODEL}
    # The warm-up first, then the workload: the same ids, lengths and seeds as over gRPC.
    sent = sorted(server.bodies[1:], key=lambda body: body["seed"])
    assert [b["prompt"] for b in sent] == [r.prompt_token_ids for r in REQUESTS]
    assert [b["max_tokens"] for b in sent] == [r.max_tokens for r in REQUESTS]
    for body in sent:
        assert (body["model"], body["ignore_eos"], body["temperature"]) == (MODEL, True, 0.0)
        assert body["stream"] and body["stream_options"] == {"include_usage": True}


def test_a_wrong_key_fails_the_warm_up_with_the_servers_answer(server):
    run = openai_backend.run_rates(server.url, REQUESTS, [math.inf], ClientSettings(), api_key="x")
    with pytest.raises(RuntimeError, match="HTTP 401"):
        asyncio.run(run)
    assert server.bodies == []


def test_cbserve_bench_backend_openai_writes_a_report_naming_the_url(server, tmp_path, model_dir):
    argv = ["--backend", "openai", "--base-url", server.url, "--api-key", KEY]
    argv += ["--served-model-name", "named", "--dataset", "random", "--num-prompts", "3"]
    argv += ["--random-output-len", "4", "--no-plots", "--no-progress", "--out-dir", str(tmp_path)]
    assert serve.main(argv) == 0
    assert {body["model"] for body in server.bodies} == {"named"}
    written = json.loads((tmp_path / "results.json").read_text())
    text = json.dumps(written)
    assert f"openai {server.url}/v1" in text
    assert KEY not in text, "the key must not be written to the results"
    assert KEY not in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "openai"], "--base-url"),
        (["--base-url", "http://h:1"], "--backend openai"),
        (["--backend", "openai", "--base-url", "h:1"], "http://"),
        (["--backend", "openai", "--base-url", "http://h:1", "--server", "h:2"], "--server"),
    ],
)
def test_backend_flags_are_checked(argv, message):
    import argparse

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert message in options.check(parser.parse_args(argv))


def test_the_recorded_command_hides_the_key():
    recorded = options.recorded_command(["cbserve", "bench", "--api-key", "k1", "--api-key=k2"])
    assert "k1" not in recorded and "k2" not in recorded and "REDACTED" in recorded


def test_the_front_comparison_runs_a_valid_bench_command_and_tabulates_ratios(tmp_path):
    import argparse

    from bench.serving import front_overhead

    args = front_overhead._parser().parse_args(["--out-dir", str(tmp_path)])
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    parsed = parser.parse_args(front_overhead._bench_argv(args, tmp_path))
    assert options.check(parsed) is None
    assert (parsed.max_concurrency, parsed.num_prompts) == (64, 256)
    grpc = {"output_throughput": 200.0, "request_throughput": 2.0, "failed": 0}
    grpc |= {"ttft_ms": {"median": 10.0, "p99": 20.0}, "itl_ms": {"median": 5.0, "p99": 8.0}}
    http = dict(grpc, output_throughput=190.0)
    table = front_overhead.comparison_table(grpc, http, 64)
    assert "| output tok/s | 200 | 190 | 0.950 |" in table
    assert "| TTFT median (ms) | 10 | 10 | 1.000 |" in table
