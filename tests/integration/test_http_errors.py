"""The HTTP front's refusals, in OpenAI's error shape, and a client that goes away.

Bad input is a 400 naming the field, whether FastAPI catches it (wrong type,
malformed JSON) or the one request path does (a value out of range); and a
client that disconnects mid-stream cancels its request, whose blocks are freed.
"""

from __future__ import annotations

import json
import socket

import httpx2 as httpx
import openai
import pytest

from tests.integration.stacks import wait_for_metric

ABORTED = 'cbserve_requests_finished_total{reason="abort"}'
CHAT = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def base_url(http_base_url) -> str:
    return http_base_url


@pytest.fixture(scope="module")
def api(openai_api):
    return openai_api


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"logprobs": True, "top_logprobs": 21}, "logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"max_completion_tokens": 10**6}, "max_tokens"),
    ],
)
def test_out_of_range_values_are_400_naming_the_field(api, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model="any", messages=CHAT, **fields)
    assert raised.value.status_code == 400
    error = raised.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": CHAT, "temperature": "hot"}, "temperature"),
        ({"messages": CHAT, "n": "two"}, "n"),
        ({"messages": CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role"),
        ({}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": CHAT, "n": 0}, "n"),
    ],
)
def test_wrong_types_and_missing_fields_are_400_naming_the_field(base_url, body, param):
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert _error(response)["param"] == param


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"\xff\xfe"])
def test_malformed_bodies_are_400(base_url, content):
    response = httpx.post(
        f"{base_url}/v1/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert _error(response)["type"] == "invalid_request_error"


def test_a_prompt_too_long_for_the_model_is_400(api):
    with pytest.raises(openai.BadRequestError) as raised:
        api.completions.create(model="any", prompt=[100] * 9000, max_tokens=4)
    assert raised.value.body["param"] == "prompt"


def test_a_streamed_refusal_comes_before_the_stream(base_url):
    body = {"prompt": "x", "stream": True, "temperature": -1}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert _error(response)["param"] == "temperature"


def test_unknown_routes_answer_in_the_openai_shape(base_url):
    response = httpx.get(f"{base_url}/v1/embeddings")
    assert response.status_code in (404, 405)
    _error(response)


def test_disconnect_mid_stream_frees_the_blocks(http_stack, base_url):
    aborted_before = http_stack.metrics().get(ABORTED, 0.0)
    body = {
        "messages": CHAT,
        "stream": True,
        "max_tokens": 2000,
        "ignore_eos": True,
        "temperature": 0.0,
        "n": 2,
    }
    url = f"{base_url}/v1/chat/completions"
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as stream:
        assert stream.status_code == 200
        # Four events (each a line and a blank one). The iterator is kept: dropping it
        # would close the connection here already (httpcore closes an unread stream).
        lines = stream.iter_lines()
        seen = [next(lines) for _ in range(8)]
        assert all(line.startswith("data: {") for line in seen[::2]) and not any(seen[1::2])
        # Both choices are running, thousands of tokens from their end.
        wait_for_metric(http_stack, "cbserve_num_requests_running", 2, timeout_s=20)
        assert http_stack.metrics().get(ABORTED, 0.0) == aborted_before
    # Leaving the block closed the connection.
    after = wait_for_metric(http_stack, ABORTED, aborted_before + 2)
    assert after["cbserve_num_requests_running"] == 0
    wait_for_metric(http_stack, "cbserve_kv_blocks_used", 0)


def test_disconnect_before_a_whole_answer_frees_the_blocks(http_stack):
    aborted_before = http_stack.metrics().get(ABORTED, 0.0)
    body = json.dumps({"prompt": "Once", "max_tokens": 2000, "ignore_eos": True}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    # A raw socket, so that the client is gone exactly when the test says.
    with socket.create_connection(("127.0.0.1", http_stack.http_port), timeout=30) as raw:
        raw.sendall(head.encode() + body)
        wait_for_metric(http_stack, "cbserve_num_requests_running", 1, timeout_s=20)
    after = wait_for_metric(http_stack, ABORTED, aborted_before + 1)
    assert after["cbserve_num_requests_running"] == 0
