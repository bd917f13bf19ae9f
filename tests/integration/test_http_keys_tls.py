"""The HTTP front locked: API keys (401 in OpenAI's shape without the right one; health,
metrics and version stay open) and HTTPS with --tls-cert/--tls-key (a client that
trusts the test CA streams; plaintext HTTP to the port is refused)."""

from __future__ import annotations

import ssl

import httpx2 as httpx
import openai
import pytest

from cbserve.local_stack import free_port
from tests.integration.stacks import started_stack, stop_stack

KEY = "sk-test-key-1"
OTHER_KEY = "sk-test-key-2"
CHAT = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def https_stack(test_certificates):
    port = free_port()
    running = started_stack(
        worker_args=["--dtype", "float32"],
        scheduler_args=[
            *("--http-port", str(port)),
            *("--api-key", KEY, "--api-key", OTHER_KEY),
            *("--tls-cert", str(test_certificates.server_cert)),
            *("--tls-key", str(test_certificates.server_key)),
        ],
    )
    running.http_port = port
    assert f"http_port={port}" in running.scheduler.wait_ready()
    yield running
    stop_stack(running)
    # SIGTERM: drained, the HTTP front stopped as a bounded stage, a clean exit.
    assert running.scheduler.process.returncode == 0


@pytest.fixture(scope="module")
def base_url(https_stack) -> str:
    return f"https://127.0.0.1:{https_stack.http_port}"


@pytest.fixture
def trusting(test_certificates):
    trusted = ssl.create_default_context(cafile=str(test_certificates.ca))
    with httpx.Client(verify=trusted, timeout=60) as client:
        yield client


def _api(base_url: str, http_client, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=key, http_client=http_client, max_retries=0
    )


def test_a_client_trusting_the_ca_streams_over_https_with_a_key(base_url, trusting):
    for key in (KEY, OTHER_KEY):
        chunks = _api(base_url, trusting, key).chat.completions.create(
            model="any", messages=CHAT, max_tokens=4, temperature=0.0, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        assert text


def test_a_wrong_key_is_401(base_url, trusting):
    with pytest.raises(openai.AuthenticationError) as raised:
        _api(base_url, trusting, "sk-wrong").completions.create(
            model="any", prompt="x", max_tokens=2
        )
    assert raised.value.status_code == 401
    assert raised.value.body["message"] == "the API key is not valid"
    with pytest.raises(openai.AuthenticationError):
        _api(base_url, trusting, "sk-wrong").models.list()


def test_no_key_is_401_in_the_openai_shape(base_url, trusting):
    response = trusting.post(
        f"{base_url}/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "API key is required" in error["message"]


def test_health_metrics_and_version_need_no_key(base_url, trusting):
    for path in ("/health", "/metrics", "/version"):
        assert trusting.get(base_url + path).status_code == 200, path


def test_plaintext_http_is_refused(https_stack):
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{https_stack.http_port}/health", timeout=10)


def test_a_client_that_does_not_trust_the_ca_is_refused(base_url):
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base_url}/health", timeout=10)


def test_tokenize_and_detokenize_need_the_key_and_the_document_says_so(base_url, trusting):
    bearer = {"Authorization": f"Bearer {KEY}"}
    for path, body in (("/tokenize", {"prompt": "Hello"}), ("/detokenize", {"tokens": [19556]})):
        refused = trusting.post(base_url + path, json=body)
        assert refused.status_code == 401, path
        assert "API key is required" in refused.json()["error"]["message"]
        assert trusting.post(base_url + path, json=body, headers=bearer).status_code == 200
    document = trusting.get(f"{base_url}/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for operation in operations.values():
            keyed = path not in ("/health", "/metrics", "/version")
            assert ("security" in operation) == keyed, path
            assert ("401" in operation["responses"]) == keyed, path
