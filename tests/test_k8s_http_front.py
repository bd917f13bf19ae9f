"""deploy/k8s and the scheduler's HTTP front: the Service exposes it, readiness asks its
/health, and the API key comes from an optional Secret that the repository ships only
as an example (no key is committed)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.test_k8s_manifests import (
    K8S_VERSIONS,
    _container,
    _documents,
    _one,
    _scheduler_args,
    variants,
)

pytestmark = pytest.mark.process

EXAMPLE_SECRET = Path(__file__).resolve().parent.parent / "deploy/k8s/api-key-secret.example.yaml"


def _scheduler(variant: str) -> dict:
    return _container(_one(variant, "Deployment", "cbserve-scheduler"))


@variants
def test_the_service_exposes_the_http_port_the_scheduler_serves(variant):
    http_port = _scheduler_args(variant).http_port
    assert http_port == 8000
    service = _one(variant, "Service", "cbserve")
    (port,) = [port for port in service["spec"]["ports"] if port["name"] == "http"]
    assert (port["port"], port["targetPort"], port["appProtocol"]) == (8000, "http", "http")
    container_ports = {port["name"]: port["containerPort"] for port in _scheduler(variant)["ports"]}
    assert container_ports["http"] == http_port


@variants
def test_scheduler_readiness_is_http_health_and_liveness_stays_grpc(variant):
    scheduler = _scheduler(variant)
    readiness = scheduler["readinessProbe"]
    assert "grpc" not in readiness
    assert readiness["httpGet"] == {"path": "/health", "port": "http"}
    container_ports = {port["name"]: port["containerPort"] for port in scheduler["ports"]}
    assert container_ports[readiness["httpGet"]["port"]] == _scheduler_args(variant).http_port
    grpc_port = _scheduler_args(variant).port
    assert scheduler["livenessProbe"]["grpc"]["port"] == grpc_port
    assert scheduler["startupProbe"]["grpc"]["port"] == grpc_port


@variants
def test_the_api_key_comes_from_an_optional_secret_and_none_is_committed(variant):
    (variable,) = [v for v in _scheduler(variant)["env"] if v["name"] == "CBSERVE_API_KEY"]
    reference = variable["valueFrom"]["secretKeyRef"]
    assert reference["optional"] is True, "the stack must run without a Secret"
    assert not [d for d in _documents(variant) if d["kind"] == "Secret"]
    # The example names the Secret and key the scheduler reads, where it runs.
    example = yaml.safe_load(EXAMPLE_SECRET.read_text())
    assert example["metadata"]["name"] == reference["name"]
    assert reference["key"] in example["stringData"]
    namespace = _one(variant, "Deployment", "cbserve-scheduler")["metadata"]["namespace"]
    assert example["metadata"]["namespace"] == namespace
    # Workers never see it.
    worker = _container(_one(variant, "StatefulSet", "cbserve-worker"))
    assert "CBSERVE_API_KEY" not in [v["name"] for v in worker.get("env", [])]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_example_secret_passes_the_kubernetes_schema(version):
    kubernetes_validate.validate(yaml.safe_load(EXAMPLE_SECRET.read_text()), version, strict=True)
