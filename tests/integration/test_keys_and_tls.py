"""Both gRPC doors locked at once, on real processes over loopback: one stack whose
scheduler wants an API key and speaks TLS, and talks to its worker over mutual TLS
(the worker accepts only a client certificate signed by the test CA).

One stack serves every assertion (the suite's time is counted); generations are a
few tokens long.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.cli import main as cli_main
from cbserve.client import AsyncClient, Client
from cbserve.worker.v1 import worker_pb2 as wpb
from cbserve.worker.v1 import worker_pb2_grpc as wpb_grpc
from common.health_probe import EXIT_SERVING, EXIT_UNHEALTHY, check
from common.health_probe import main as probe_main
from common.tls import channel_security, open_channel
from tests.integration.stacks import started_stack, stop_stack
from tests.integration.test_reflection import ReflectedServer

KEY = "test-key-7f3a"
GENERATION = "cbserve.v1.Generation"


@pytest.fixture(scope="module")
def locked_stack(test_certificates):
    certs = test_certificates
    worker_tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    stack = started_stack(
        worker_args=["--dtype", "float32", *worker_tls, "--tls-client-ca", str(certs.ca)],
        scheduler_args=[
            *("--api-key", KEY, "--api-key", "second-key"),
            *("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)),
            *("--worker-tls-ca", str(certs.ca)),
            *("--worker-tls-cert", str(certs.client_cert)),
            *("--worker-tls-key", str(certs.client_key)),
        ],
    )
    yield stack
    stop_stack(stack)


def _worker_address(stack) -> str:
    return f"{stack.host}:{stack.worker_ports[0]}"


def test_the_right_key_over_tls_streams_through_the_mutual_tls_worker(
    locked_stack, test_certificates
):
    with Client(locked_stack.address, api_key=KEY, tls_ca=test_certificates.ca) as client:
        chunks = list(client.generate("The sky is", max_tokens=4, ignore_eos=True, temperature=0))
        info = client.model_info()
    assert chunks[-1].usage.completion_tokens == 4
    assert sum(len(chunk.token_ids) for chunk in chunks) == 4
    assert info.num_workers == 1 and info.model_name


def test_the_async_client_sends_the_key_and_trusts_ca_bytes(locked_stack, test_certificates):
    async def complete():
        ca = test_certificates.ca.read_bytes()
        async with AsyncClient(locked_stack.address, api_key="second-key", tls_ca=ca) as client:
            return await client.complete("Hello", max_tokens=3, ignore_eos=True)

    completion = asyncio.run(complete())
    assert completion.usage.completion_tokens == 3 and completion.finish_reason == "LENGTH"


@pytest.mark.parametrize("api_key", [None, "not-the-key"])
def test_a_missing_or_wrong_key_is_unauthenticated(locked_stack, test_certificates, api_key):
    with Client(locked_stack.address, api_key=api_key, tls_ca=test_certificates.ca) as client:
        with pytest.raises(grpc.RpcError) as streamed:
            list(client.generate("Hello", max_tokens=2))
        with pytest.raises(grpc.RpcError) as unary:
            client.model_info()
    for raised in (streamed, unary):
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        if api_key is None:
            assert "Bearer <key>" in raised.value.details()
        else:
            assert raised.value.details() == "the API key is not valid"


def test_health_and_reflection_answer_without_a_key(locked_stack, test_certificates):
    security = channel_security(test_certificates.ca)
    serving, reason = check(locked_stack.address, GENERATION, security=security)
    assert serving, reason
    ca = str(test_certificates.ca)
    assert probe_main([locked_stack.address, "--tls-ca", ca, "--quiet"]) == EXIT_SERVING
    credentials = grpc.ssl_channel_credentials(test_certificates.ca.read_bytes())
    with grpc.secure_channel(locked_stack.address, credentials) as channel:
        assert GENERATION in ReflectedServer(channel).services()


def test_a_plaintext_client_is_refused_by_the_tls_scheduler(locked_stack):
    client = Client(locked_stack.address, api_key=KEY, retry=None)
    with client, pytest.raises(grpc.RpcError) as raised:
        client.model_info(timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert probe_main([locked_stack.address, "--timeout", "2"]) == EXIT_UNHEALTHY


def test_the_worker_refuses_plaintext_and_clients_without_a_certificate(
    locked_stack, test_certificates
):
    address = _worker_address(locked_stack)
    certs = test_certificates
    plaintext, _ = check(address, timeout=2)
    no_client_cert, reason = check(address, timeout=2, security=channel_security(certs.ca))
    assert not plaintext and not no_client_cert, reason
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        wpb_grpc.WorkerStub(channel).Describe(wpb.DescribeRequest(), timeout=2)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    # The probe a compose health check runs against a mutual-TLS worker.
    mutual = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert)]
    assert probe_main([address, *mutual, "--tls-key", str(certs.client_key)]) == EXIT_SERVING


def test_the_worker_certificate_is_checked_against_the_server_name(locked_stack, test_certificates):
    """--worker-tls-server-name: the name checked instead of the address dialled."""
    certs = test_certificates

    def describe(server_name: str):
        security = channel_security(
            certs.ca, str(certs.client_cert), str(certs.client_key), server_name
        )

        async def call():
            async with open_channel(_worker_address(locked_stack), security) as channel:
                return await wpb_grpc.WorkerStub(channel).Describe(wpb.DescribeRequest(), timeout=5)

        return asyncio.run(call())

    assert describe("localhost").num_kv_blocks > 0
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        describe("not-in-the-certificate.example")
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_cli_takes_the_key_from_the_environment_and_the_ca_from_a_flag(
    locked_stack, test_certificates, monkeypatch, capsys
):
    server = ["--server", locked_stack.address, "--tls-ca", str(test_certificates.ca)]
    monkeypatch.setenv("CBSERVE_API_KEY", f"{KEY},another")
    assert (
        cli_main(["generate", "Hi", *server, "--max-tokens", "2", "--ignore-eos", "--usage"]) == 0
    )
    assert "completion_tokens=2" in capsys.readouterr().err
    assert cli_main(["info", *server, "--api-key", "wrong"]) == 1
    assert "UNAUTHENTICATED: the API key is not valid" in capsys.readouterr().err
