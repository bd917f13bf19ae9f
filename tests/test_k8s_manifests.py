"""deploy/k8s renders, passes the Kubernetes schemas, and runs the real command lines.

Each kustomization (the base, and every overlay) is rendered with
deploy/render_kustomize.py, compared with `kubectl kustomize` where kubectl is
installed, and every document is validated offline with kubernetes-validate (strict:
an unknown or misspelt field fails). The containers' args are expanded the way the
kubelet expands $(VAR) from their environment, then handed to the processes' own
argument parsers, as tests/test_compose.py does for docker-compose.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from deploy.render_kustomize import KustomizeError, config_map_hash, render
from scheduler_svc.__main__ import parse_args as parse_scheduler_args
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args

K8S_DIR = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUSTOMIZATIONS = {
    "base": K8S_DIR / "base",
    **{path.name: path for path in sorted((K8S_DIR / "overlays").iterdir()) if path.is_dir()},
}
# Native gRPC probes are GA from 1.27; the newest bundled schemas catch removals.
K8S_VERSIONS = ["1.27.0", latest_version()]
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

variants = pytest.mark.parametrize("variant", sorted(KUSTOMIZATIONS))


def _documents(variant: str) -> list[dict]:
    return render(KUSTOMIZATIONS[variant])


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


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@variants
def test_renderer_matches_kubectl_kustomize(variant):
    result = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZATIONS[variant])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert _documents(variant) == [doc for doc in yaml.safe_load_all(result.stdout) if doc]


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
    assert ports == {"grpc": args.port, "metrics": args.metrics_port}


@variants
def test_every_container_has_native_grpc_probes_on_its_port(variant):
    ports = {"cbserve-worker": _worker_args(variant).port}
    ports["cbserve-scheduler"] = _scheduler_args(variant).port
    for workload in _documents(variant):
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        container = _container(workload)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
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


def test_changing_a_flag_renames_the_config_map():
    # The hash suffix is what rolls the pods when a flag changes.
    config_map = {"kind": "ConfigMap", "data": {"CBSERVE_LOG_LEVEL": "info"}}
    changed = {"kind": "ConfigMap", "data": {"CBSERVE_LOG_LEVEL": "debug"}}
    assert config_map_hash(config_map) != config_map_hash(changed)
    assert re.fullmatch(r"[a-z0-9]{10}", config_map_hash(config_map))


def test_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: dev-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)
