"""TLS and key settings checked without starting a model: PEM files that cannot serve
fail with the flag and file named, the flags that go together, and the client's key
metadata. A real grpc.aio server (create_server with credentials and the key
interceptor) answers the probe and a stand-in Generation service in this process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import pytest

from cbserve.connection import api_key_from_env, call_metadata
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.grpc_server import create_server, set_serving
from common.health_probe import EXIT_SERVING, EXIT_UNHEALTHY
from common.health_probe import main as probe_main
from common.tls import TlsError, channel_security, server_credentials
from scheduler_svc.api.grpc_auth import interceptors_for
from scheduler_svc.config import EdgeConfig
from scheduler_svc.grpc_security import grpc_server_security, worker_channel_security
from worker_svc.config import WorkerConfig


def test_a_missing_file_names_the_flag_and_the_path(test_certificates, tmp_path):
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(TlsError, match=f"^--tls-key {missing}: No such file"):
        server_credentials(str(test_certificates.server_cert), str(missing))


def test_a_file_that_is_not_pem_is_refused(test_certificates, tmp_path):
    garbage = tmp_path / "cert.der"
    garbage.write_bytes(b"\x30\x82\x01\x00 not pem")
    with pytest.raises(TlsError, match="--tls-cert .*not a PEM file"):
        server_credentials(str(garbage), str(test_certificates.server_key))


def test_a_key_of_another_certificate_is_refused(test_certificates):
    certs = test_certificates
    with pytest.raises(TlsError, match="is not the key of --tls-cert"):
        server_credentials(str(certs.server_cert), str(certs.client_key))


def test_a_ca_file_without_a_certificate_is_refused(test_certificates):
    certs = test_certificates
    with pytest.raises(TlsError, match="^--tls-client-ca .*no CA certificate"):
        server_credentials(str(certs.server_cert), str(certs.server_key), str(certs.server_key))
    with pytest.raises(TlsError, match="^--tls-ca "):
        channel_security(str(certs.client_key))


def test_a_client_certificate_needs_its_key(test_certificates):
    with pytest.raises(TlsError, match="go together"):
        channel_security(test_certificates.ca, cert=str(test_certificates.client_cert))


@pytest.mark.process
def test_both_processes_refuse_to_start_with_one_line_naming_the_file(test_certificates):
    certs = test_certificates
    cases = {
        "scheduler_svc": ["--port", "0", "--worker", "127.0.0.1:1"]
        + ["--worker-tls-ca", str(certs.ca), "--worker-tls-cert", str(certs.client_cert)]
        + ["--worker-tls-key", str(certs.server_key)],
        "worker_svc": ["--port", "0", "--tls-cert", str(certs.server_cert)]
        + ["--tls-key", str(certs.server_key), "--tls-client-ca", "/nonexistent/ca.pem"],
    }
    expected = {
        "scheduler_svc": f"scheduler_svc: cannot start: --worker-tls-key {certs.server_key} "
        f"is not the key of --worker-tls-cert {certs.client_cert}",
        "worker_svc": "worker_svc: cannot start: --tls-client-ca /nonexistent/ca.pem: "
        "No such file or directory",
    }
    for module, args in cases.items():
        result = subprocess.run(
            [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1
        assert result.stderr.strip() == expected[module]


def test_the_scheduler_builds_its_grpc_security_from_edge_config(test_certificates):
    certs = test_certificates
    plain, no_keys = grpc_server_security(EdgeConfig())
    assert plain is None and no_keys == [] and worker_channel_security(EdgeConfig()) is None
    edge = EdgeConfig(
        api_key=["k"],
        tls_cert=str(certs.server_cert),
        tls_key=str(certs.server_key),
        worker_tls_ca=str(certs.ca),
        worker_tls_cert=str(certs.client_cert),
        worker_tls_key=str(certs.client_key),
        worker_tls_server_name="workers.cbserve.svc",
    )
    credentials, interceptors = grpc_server_security(edge)
    assert isinstance(credentials, grpc.ServerCredentials) and len(interceptors) == 1
    security = worker_channel_security(edge)
    assert security.options() == [("grpc.ssl_target_name_override", "workers.cbserve.svc")]
    wrong = EdgeConfig(worker_tls_ca=str(certs.client_key))
    with pytest.raises(TlsError, match="^--worker-tls-ca "):
        worker_channel_security(wrong)


def test_the_worker_server_name_needs_worker_tls():
    with pytest.raises(ValueError, match="worker_tls_server_name needs worker_tls_ca"):
        EdgeConfig(worker_tls_server_name="workers")
    with pytest.raises(ValueError, match="must not be empty"):
        EdgeConfig(worker_tls_ca="ca.pem", worker_tls_server_name=" ")


def test_the_worker_serves_plaintext_unless_given_a_certificate(test_certificates, tmp_path):
    assert WorkerConfig(model=str(tmp_path)).credentials() is None
    certs = test_certificates
    config = WorkerConfig(
        model=str(tmp_path),
        tls_cert=str(certs.server_cert),
        tls_key=str(certs.client_key),
        tls_client_ca=str(certs.ca),
    )
    with pytest.raises(TlsError, match="is not the key of"):
        config.credentials()


def test_the_client_sends_its_key_as_bearer_metadata(monkeypatch):
    assert call_metadata(None) is None
    assert call_metadata("abc") == (("authorization", "Bearer abc"),)
    for unusable in ("", " abc", "a\nb"):
        with pytest.raises(ValueError, match="api_key"):
            call_metadata(unusable)
    monkeypatch.setenv("CBSERVE_API_KEY", " first , second")
    assert api_key_from_env() == "first"
    monkeypatch.setenv("CBSERVE_API_KEY", "")
    assert api_key_from_env() is None


class _Generation(pb_grpc.GenerationServicer):
    """A stand-in for the scheduler's service: what the key check lets through."""

    async def GetModelInfo(self, request, context):  # noqa: N802 (gRPC method name)
        return pb.ModelInfo(model_name="stand-in")

    async def Generate(self, request, context):  # noqa: N802 (gRPC method name)
        yield pb.GenerateResponse(text="ok")


async def _locked_server(certs):
    credentials = server_credentials(str(certs.server_cert), str(certs.server_key))
    server, health, port = create_server(
        "127.0.0.1:0", credentials=credentials, interceptors=interceptors_for(["k"])
    )
    pb_grpc.add_GenerationServicer_to_server(_Generation(), server)
    await set_serving(health, [], serving=True)
    await server.start()
    return server, f"localhost:{port}"


def test_the_key_locks_generation_but_not_health_over_tls(test_certificates):
    certs = test_certificates
    credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes())

    async def scenario():
        server, address = await _locked_server(certs)
        try:
            async with grpc.aio.secure_channel(address, credentials) as channel:
                stub = pb_grpc.GenerationStub(channel)
                keyed = call_metadata("k")
                info = await stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=keyed)
                replies = [
                    r.text async for r in stub.Generate(pb.GenerateRequest(), metadata=keyed)
                ]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    [r async for r in stub.Generate(pb.GenerateRequest())]
            # The synchronous probe runs in threads while this loop serves it.
            probes = await asyncio.gather(
                asyncio.to_thread(probe_main, [address, "--tls-ca", str(certs.ca), "--quiet"]),
                asyncio.to_thread(probe_main, [address, "--timeout", "2"]),
            )
        finally:
            await server.stop(grace=None)
        return info, replies, refused.value, probes

    info, replies, refused, probes = asyncio.run(scenario())
    assert info.model_name == "stand-in" and replies == ["ok"]
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Bearer <key>" in refused.details() and "CBSERVE_API_KEY" in refused.details()
    assert probes == [EXIT_SERVING, EXIT_UNHEALTHY]
