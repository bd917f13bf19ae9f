"""--api-processes 2 on one locked stack: both doors (gRPC and HTTP) with API keys and
TLS, served by two API processes on shared ports beside one core, over two null
workers. Every test opens its connections one by one, so that SO_REUSEPORT spreads
them over both API processes, and checks in the scheduler's log that both served.

Only tests that kill nothing share this stack; drain, a killed API process and a
worker lost are in test_api_processes_faults.py, stop strings on the real model in
test_api_processes_text.py.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from collections import Counter

import grpc
import httpx2 as httpx
import pytest

from cbserve.v1 import generation_pb2 as pb
from common.health_probe import check
from common.metrics import parse_samples
from common.tls import channel_security
from tests.integration.split import (
    API_PROCESSES,
    OwnConnection,
    https_client,
    log_lines,
    served_by,
    split_stack,
)
from tests.integration.stacks import stop_stack, wait_until_idle
from tests.waiting import wait_until

KEY = "split-test-key"
STREAM_LIMIT = 40
GENERATION = "cbserve.v1.Generation"
TOKENS = 24
# Fresh connections per check: the chance that all land on one of two processes is 2^-12.
CONNECTIONS = 12
# A stream that must still run while the test acts: 4000 steps of a null worker's 4 ms.
LONG_TOKENS = 4000
FINISHED_LENGTH = 'cbserve_requests_finished_total{reason="length"}'
FINISHED_ABORT = 'cbserve_requests_finished_total{reason="abort"}'


@pytest.fixture(scope="module")
def locked(tmp_path_factory, test_certificates):
    certs = test_certificates
    stack = split_stack(
        tmp_path_factory.mktemp("split"),
        num_workers=2,
        http_port=0,
        scheduler_args=(
            *("--api-key", KEY),
            *("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)),
            *("--max-concurrent-streams", str(STREAM_LIMIT)),
        ),
    )
    yield stack
    stop_stack(stack)


def _connection(stack, ca, api_key=KEY) -> OwnConnection:
    return OwnConnection(stack.address, ca, api_key)


async def _grpc_stream(stack, ca, request_id: str, max_tokens: int = TOKENS) -> list:
    connection = _connection(stack, ca)
    try:
        return [
            response
            async for response in connection.generate(
                "Hello", request_id=request_id, max_tokens=max_tokens, ignore_eos=True
            )
        ]
    finally:
        await connection.close()


async def _http_stream(stack, ca, request_id: str) -> list[dict]:
    body = {"prompt": "Hello", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": request_id}
    chunks = []
    async with https_client(ca, timeout=120) as client:
        url = f"{stack.http_url}/v1/completions"
        async with client.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def test_many_grpc_and_http_streams_complete_on_both_api_processes(locked, test_certificates):
    ca = test_certificates.ca
    grpc_ids = [f"spread-grpc-{i}" for i in range(24)]
    http_ids = [f"spread-http-{i}" for i in range(12)]

    async def run():
        return await asyncio.gather(
            asyncio.gather(*(_grpc_stream(locked, ca, rid) for rid in grpc_ids)),
            asyncio.gather(*(_http_stream(locked, ca, rid) for rid in http_ids)),
        )

    grpc_streams, http_streams = asyncio.run(run())
    for request_id, responses in zip(grpc_ids, grpc_streams, strict=True):
        assert [r.request_id for r in responses] == [request_id] * len(responses)
        assert sum(len(r.token_ids) for r in responses) == TOKENS
        assert responses[-1].finish_reason == pb.LENGTH
        assert responses[-1].usage.completion_tokens == TOKENS
        assert "".join(r.text for r in responses)
    for chunks in http_streams:
        assert chunks[-1]["usage"]["completion_tokens"] == TOKENS
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    grpc_by_process = served_by(locked, grpc_ids)
    http_by_process = served_by(locked, http_ids)
    assert sum(grpc_by_process.values()) == len(grpc_ids)
    assert sum(http_by_process.values()) == len(http_ids)
    assert set(grpc_by_process) == set(range(API_PROCESSES)), grpc_by_process
    assert set(http_by_process) == set(range(API_PROCESSES)), http_by_process


def test_without_the_key_both_doors_refuse_on_every_api_process(locked, test_certificates):
    ca = test_certificates.ca

    async def grpc_codes(api_key):
        codes = []
        for _ in range(CONNECTIONS):
            connection = _connection(locked, ca, api_key)
            try:
                async for _ in connection.generate("Hi", max_tokens=2):
                    pass
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as error:
                codes.append(error.code())
            finally:
                await connection.close()
        return codes

    async def http_statuses(headers):
        statuses = []
        for _ in range(CONNECTIONS):
            async with https_client(ca, timeout=30) as client:
                body = {"prompt": "Hi", "max_tokens": 2}
                response = await client.post(
                    f"{locked.http_url}/v1/completions", json=body, headers=headers
                )
                statuses.append(response.status_code)
        return statuses

    refused_before = len(_refusals(locked))
    for api_key in (None, "not-the-key"):
        assert asyncio.run(grpc_codes(api_key)) == [grpc.StatusCode.UNAUTHENTICATED] * CONNECTIONS
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        assert asyncio.run(http_statuses(headers)) == [401] * CONNECTIONS
    refusals = _refusals(locked)[refused_before:]
    assert {line["api_process"] for line in refusals} == set(range(API_PROCESSES)), refusals


def _refusals(stack) -> list[dict]:
    return [line for line in log_lines(stack) if line.get("event") == "call refused"]


def test_tls_is_required_and_health_serves_on_every_api_process(locked, test_certificates):
    security = channel_security(test_certificates.ca)
    for _ in range(CONNECTIONS):
        serving, reason = check(locked.address, GENERATION, security=security)
        assert serving, reason
    plaintext, reason = check(locked.address, GENERATION, timeout=2)
    assert not plaintext and "UNAVAILABLE" in reason, reason
    trusting = ssl.create_default_context(cafile=str(test_certificates.ca))
    for _ in range(CONNECTIONS):
        response = httpx.get(f"{locked.http_url}/health", verify=trusting, timeout=10)
        assert response.status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{locked.http_port}/health", timeout=10)


def _scrape_text(url: str, ca=None) -> str:
    if ca is None:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()
    trusting = ssl.create_default_context(cafile=str(ca))
    return httpx.get(url, verify=trusting, timeout=10).text


def _assert_no_duplicates(text: str) -> None:
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(declared) == len(set(declared)), sorted(declared)
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line[:1] not in ("#", "")]
    assert len(samples) == len(set(samples))


def test_metrics_are_one_view_on_the_core_and_on_every_http_front(locked, test_certificates):
    ca = test_certificates.ca
    wait_until_idle(locked)
    before = locked.metrics()[FINISHED_LENGTH]
    request_ids = [f"metrics-{i}" for i in range(8)]

    async def run():
        await asyncio.gather(*(_grpc_stream(locked, ca, rid) for rid in request_ids))

    asyncio.run(run())
    assert set(served_by(locked, request_ids)) == set(range(API_PROCESSES))
    wait_until_idle(locked)
    core_text = _scrape_text(locked.metrics_url)
    core = parse_samples(core_text)
    # Counted in two API processes, summed in one view.
    assert core[FINISHED_LENGTH] == before + len(request_ids)
    _assert_no_duplicates(core_text)
    steps = {name: value for name, value in core.items() if "step_duration_seconds_count" in name}
    assert len(steps) == 2 and all(value > 0 for value in steps.values()), steps
    for _ in range(CONNECTIONS // 2):
        front_text = _scrape_text(f"{locked.http_url}/metrics", ca)
        _assert_no_duplicates(front_text)
        front = parse_samples(front_text)
        assert front[FINISHED_LENGTH] == core[FINISHED_LENGTH]
        assert {name: front[name] for name in steps} == steps
        assert _declared(front_text) == _declared(core_text)


def _declared(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_stream_limit_holds_across_api_processes(locked, test_certificates):
    """STREAM_LIMIT streams over both processes: neither holds them all itself, so the
    next call is refused by the core, which counts every process's streams."""
    ca = test_certificates.ca
    request_ids = [f"limit-{i}" for i in range(STREAM_LIMIT)]

    async def run():
        connections = [_connection(locked, ca) for _ in request_ids]
        calls = [
            connection.generate("Hello", request_id=rid, max_tokens=LONG_TOKENS, ignore_eos=True)
            for connection, rid in zip(connections, request_ids, strict=True)
        ]
        try:
            for call in calls:  # each has its first token: it is live in the core
                assert (await call.read()).token_ids
            refused = []
            for _ in range(CONNECTIONS):
                extra = OwnConnection(locked.address, ca, KEY)
                try:
                    with pytest.raises(grpc.aio.AioRpcError) as raised:
                        async for _ in extra.generate("Hi", max_tokens=2):
                            pass
                    refused.append(raised.value)
                finally:
                    await extra.close()
            return refused
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*(connection.close() for connection in connections))

    refused = asyncio.run(run())
    assert {error.code() for error in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("--max-concurrent-streams" in error.details() for error in refused)
    # Each handler logs its abort once it sees the cancel.
    held = Counter()

    def all_logged() -> bool:
        held.clear()
        held.update(served_by(locked, request_ids))
        return sum(held.values()) == STREAM_LIMIT

    wait_until(lambda: f"{STREAM_LIMIT} aborts logged (by process: {held})", all_logged, 10.0)
    assert set(held) == set(range(API_PROCESSES)), held
    wait_until_idle(locked)


def test_a_client_gone_mid_stream_frees_its_request_in_the_core(locked, test_certificates):
    ca = test_certificates.ca
    before = locked.metrics()

    async def run():
        connection = _connection(locked, ca)
        call = connection.generate("Hello " * 200, max_tokens=LONG_TOKENS, ignore_eos=True)
        for _ in range(3):
            assert (await call.read()).token_ids
        held = locked.metrics()
        call.cancel()
        await connection.close()
        return held

    held = asyncio.run(run())
    assert held["cbserve_num_requests_running"] == 1
    assert held["cbserve_kv_blocks_used"] > 0
    # LONG_TOKENS steps take 16 s and more: idle well before that is the abort's doing.
    idle = wait_until_idle(locked, timeout_s=8.0)
    assert idle["cbserve_kv_blocks_used"] == 0
    assert idle[FINISHED_ABORT] == before[FINISHED_ABORT] + 1
    assert idle[FINISHED_LENGTH] == before[FINISHED_LENGTH]


def test_logprobs_and_prompt_logprobs_cross_from_the_core(locked, test_certificates):
    async def run():
        connection = _connection(locked, test_certificates.ca)
        try:
            call = connection.generate(
                "one two three four", max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=1
            )
            return [response async for response in call]
        finally:
            await connection.close()

    responses = asyncio.run(run())
    prompt_tokens = responses[-1].usage.prompt_tokens
    assert len(responses[0].prompt_logprobs) == prompt_tokens > 1
    assert all(len(entry.top_logprobs) == 1 for entry in responses[0].prompt_logprobs[1:])
    logprobs = [entry for response in responses for entry in response.logprobs]
    assert len(logprobs) == 4 and all(len(entry.top_logprobs) == 2 for entry in logprobs)
