"""The llama.cpp baseline without llama-server: the request it sends, how its event
stream is counted, where the binary is looked for, the column it makes, and the
one-line failure when `make bench-peers` has not run. A fake /v1/completions
(aiohttp's own server) stands in for llama-server over real HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import stat

import pytest

from bench.harness import results
from bench.harness.metrics import RequestTiming
from bench.harness.runner import ClientSettings
from bench.harness.workload import BenchRequest
from bench.peers import llama_server, llamacpp
from bench.peers.openai_stream import StreamTally, completion_body, sse_data
from bench.serving import serve

REQUEST = BenchRequest(index=0, prompt_token_ids=[5, 6, 7], max_tokens=4, seed=11)


def chunk(text: str, predicted: int | None, finish: str | None = None, usage: int | None = None):
    body = {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}
    if predicted is not None:
        body["timings"] = {"predicted_n": predicted}
    if usage is not None:
        body["usage"] = {"completion_tokens": usage, "prompt_tokens": 3}
    return json.dumps(body)


# What llama-server streams for 4 tokens when the 2nd ends inside a UTF-8 character:
# it is held back and sent with the 3rd, then the last chunk carries the usage.
STREAM = [
    chunk("Hel", 1),
    chunk("lo\u00e9", 3),
    chunk("", 4),
    chunk("", None, finish="length", usage=4),
]


def test_the_body_sends_token_ids_lengths_and_per_token_timings():
    body = completion_body(REQUEST, temperature=0.0, ignore_eos=True)
    assert body == {
        "prompt": [5, 6, 7],
        "max_tokens": 4,
        "temperature": 0.0,
        "seed": 11,
        "ignore_eos": True,
        "stream": True,
        "timings_per_token": True,
    }


def test_sse_data_lines():
    assert sse_data('data: {"a": 1}') == '{"a": 1}'
    assert sse_data("data:[DONE]") == "[DONE]"
    assert sse_data("") is None
    assert sse_data(": keep-alive") is None
    assert sse_data("event: message") is None


def test_tokens_are_counted_by_predicted_n_not_by_chunks():
    tally = StreamTally(RequestTiming(prompt_tokens=3, sent_at=0.0))
    for at, payload in enumerate([*STREAM, "[DONE]"], start=1):
        tally.add(payload, at=float(at))
    timing = tally.finish()
    assert timing.ok and timing.finish_reason == "LENGTH"
    assert timing.chunks == [(1.0, 1), (2.0, 2), (3.0, 1)]
    assert timing.output_tokens == 4 and timing.ttft == 1.0


def test_without_timings_a_chunk_with_text_is_one_token_and_usage_settles_the_count():
    tally = StreamTally(RequestTiming(prompt_tokens=3, sent_at=0.0))
    for at, payload in enumerate(
        [chunk("a", None), chunk("", None), chunk("b", None), chunk("", None, "length", usage=3)]
    ):
        tally.add(payload, at=float(at))
    tally.add("[DONE]")
    assert tally.finish().chunks == [(0.0, 1), (2.0, 1), (3.0, 1)]


def test_a_stream_cut_short_or_an_error_chunk_fails_the_request():
    cut = StreamTally(RequestTiming(prompt_tokens=3, sent_at=0.0))
    cut.add(STREAM[0], at=1.0)
    assert not cut.finish().ok
    failed = StreamTally(RequestTiming(prompt_tokens=3, sent_at=0.0))
    failed.add(json.dumps({"error": {"code": 400, "message": "context full"}}))
    assert failed.finish().error == "context full"


def test_the_binary_is_looked_for_in_the_peers_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    version = llama_server.LLAMA_CPP_PYTHON_VERSION
    assert llama_server.cache_dir() == tmp_path / "llama.cpp" / version
    assert llama_server.binary_path() is None
    binary = tmp_path / "llama.cpp" / version / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert llama_server.binary_path() is None  # not executable: not a build
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert llama_server.binary_path() == binary


def test_the_server_gets_a_slot_per_request_in_flight_and_room_for_the_longest(tmp_path):
    argv = llama_server.server_argv(tmp_path / "llama-server", tmp_path / "m.gguf", 8123, 64, 2, 9)
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert flags["--parallel"] == "64" and flags["--port"] == "8123"
    assert flags["--threads"] == flags["--threads-batch"] == "2"
    assert flags["--host"] == "127.0.0.1" and flags["--ctx-size"] == "9"
    # llama-server splits its context evenly: each slot must hold prompt + output.
    assert llama_server.context_size(64, 300) // 64 >= 300


def test_bench_without_llama_server_fails_at_once_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path / "empty"))
    argv = ["--dataset", "random", "--num-prompts", "2", "--baselines", "static,llamacpp"]
    assert serve.main([*argv, "--out-dir", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [f"cbserve bench: {llama_server.MISSING}"]
    assert "make bench-peers" in captured.err
    assert not (tmp_path / "out").exists()  # nothing was measured


def test_the_llamacpp_column_sits_beside_cbserve_with_its_ratio(tmp_path):
    timing = RequestTiming(prompt_tokens=3, sent_at=0.0, chunks=[(0.5, 1), (1.0, 3)])
    columns = [
        results.Column("cbserve", "cbserve", math.inf, [timing], 1.0),
        results.Column("llama.cpp", "llamacpp", math.inf, [timing], 2.0, {"parallel": 1}),
    ]
    table, _ = results.write(
        tmp_path, "cbserve bench", WORKLOAD, [math.inf], columns, {}, [], with_plots=False
    )
    assert table.splitlines()[0] == "| metric | cbserve | llama.cpp | cbserve vs llama.cpp |"
    row = next(line for line in table.splitlines() if "Output token throughput" in line)
    assert row.split("|")[2:5] == [" 4 ", " 2 ", " 2.00x "]


WORKLOAD = {
    "dataset": "random",
    "num_prompts": 1,
    "seed": 0,
    "total_prompt_tokens": 3,
    "total_output_tokens": 4,
    "ignore_eos": True,
    "temperature": 0.0,
}


async def _fake_llama_server(events: list[str], seen: list[dict]):
    """A /v1/completions that records the body and streams `events` as SSE."""
    from aiohttp import web

    async def completions(request):
        seen.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for payload in events:
            await response.write(f"data: {payload}\n\n".encode())
            await asyncio.sleep(0.005)
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def test_requests_stream_over_http_and_are_timed_per_token():
    import aiohttp

    async def scenario():
        seen: list[dict] = []
        runner, url = await _fake_llama_server([*STREAM, "[DONE]"], seen)
        try:
            async with aiohttp.ClientSession() as session:
                settings = ClientSettings(temperature=0.0, ignore_eos=True)
                timing = await llamacpp.stream_one(session, url, REQUEST, settings)
        finally:
            await runner.cleanup()
        return seen, timing

    seen, timing = asyncio.run(scenario())
    assert seen == [completion_body(REQUEST, 0.0, True)]
    assert timing.ok and timing.output_tokens == 4 and timing.finish_reason == "LENGTH"
    assert [count for _, count in timing.chunks] == [1, 2, 1]
    assert 0 < timing.ttft <= timing.e2el


def test_missing_reports_the_build_step(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    assert llamacpp.missing() == llama_server.MISSING


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_llama_server_serves_the_gguf_cbserve_is_given(tmp_path, monkeypatch):
    from common.defaults import packaged_gguf_path

    given = tmp_path / "model.Q8_0.gguf"
    assert llamacpp.served_gguf(given) == given
    assert llamacpp.served_gguf(None) == packaged_gguf_path()
    assert llamacpp.served_gguf(tmp_path / "a-directory") == packaged_gguf_path()
    binary = tmp_path / "llama.cpp" / llama_server.LLAMA_CPP_PYTHON_VERSION / "bin"
    binary.mkdir(parents=True)
    (binary / "llama-server").write_text("#!/bin/sh\n")
    (binary / "llama-server").chmod(0o755)
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    assert llamacpp.missing(given) == f"no GGUF file at {given}"
    given.write_bytes(b"GGUF")
    assert llamacpp.missing(given) is None
