"""deploy/k8s/overlays/inference-gateway: replicas behind the Gateway API Inference
Extension, rendered by kubectl kustomize and checked offline.

Built-in kinds pass kubernetes-validate (strict, 1.27 and the newest bundled); the
InferencePool and HTTPRoute pass the strict schemas of tests/k8s_crds.py. Then what
ties the objects together: the pool selects the replica pods and targets their HTTP
port, its picker reference is the EPP's Service, the route's backend is the pool, the
EPP's event subscribers find the pods' KV-event port and label, its block size is the
workers', and each container's command line (after the kubelet's $(VAR) expansion) is
accepted by the process's own argument parser.
"""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from scheduler_svc.flags import parse_args as parse_scheduler_args
from tests.k8s_crds import is_custom
from tests.k8s_crds import validate as validate_custom
from tests.test_k8s_manifests import K8S_DIR, _kustomize, _parse
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args

pytestmark = pytest.mark.process

OVERLAY = K8S_DIR / "overlays" / "inference-gateway"
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
ENGINE_LABEL = ("llm-d.ai/engine-type", "cbserve")
KV_EVENTS_VARIABLE = "CBSERVE_SCHEDULER_KV_EVENTS_CONFIG"


@functools.cache
def _documents() -> tuple[dict, ...]:
    result = _kustomize(OVERLAY)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "kustomize warned (a deprecated field?)"
    return tuple(_parse(result.stdout))


def _one(kind: str, name: str) -> dict:
    found = [d for d in _documents() if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    assert len(found) == 1, f"expected one {kind}/{name}, rendered {len(found)}"
    return found[0]


def _container(workload: dict, name: str) -> dict:
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"]
                    if c["name"] == name]  # fmt: skip
    return container


def _environment(container: dict) -> dict[str, str]:
    environment = {}
    for source in container.get("envFrom", []):
        environment.update(_one("ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in container.get("env", []):
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.namespace":
            environment[variable["name"]] = "cbserve"
        elif field == "status.podIP":
            environment[variable["name"]] = "10.0.0.7"
        elif "value" in variable:
            environment[variable["name"]] = VARIABLE.sub(
                lambda m: environment.get(m.group(1), m.group(0)), variable["value"]
            )
    return environment


def _args(container: dict) -> list[str]:
    environment = _environment(container)
    args = []
    for arg in container["args"]:
        missing = [name for name in VARIABLE.findall(arg) if name not in environment]
        assert not missing, f"{container['name']}: {arg} uses undefined {missing}"
        args.append(VARIABLE.sub(lambda m: environment[m.group(1)], arg))
    return args


def _replicas() -> dict:
    return _one("Deployment", "cbserve-scheduler")


def _scheduler_args():
    return parse_scheduler_args(_args(_container(_replicas(), "scheduler")))


def _epp_config() -> dict:
    (config_map,) = [d for d in _documents() if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"].startswith("cbserve-epp-config")]  # fmt: skip
    return yaml.safe_load(config_map["data"]["epp-config.yaml"])


def _plugin(kind: str) -> dict:
    (plugin,) = [p for p in _epp_config()["plugins"] if p["type"] == kind]
    return plugin.get("parameters", {})


@pytest.mark.parametrize("version", ["1.27.0", latest_version()])
def test_every_document_passes_its_schema(version):
    kinds = set()
    for document in _documents():
        kinds.add(document["kind"])
        try:
            if is_custom(document):
                validate_custom(document)
            else:
                kubernetes_validate.validate(document, version, strict=True)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            pytest.fail(f"{document['kind']}/{document['metadata']['name']}: {error.message}")
    assert {"InferencePool", "HTTPRoute", "Deployment", "Service", "ConfigMap"} <= kinds


def test_the_custom_schemas_refuse_a_misspelt_field():
    pool = json.loads(json.dumps(_one("InferencePool", "cbserve")))
    pool["spec"]["targetPortNumber"] = 8000  # the v1alpha2 name, gone in v1
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(pool)


def test_each_replica_is_a_scheduler_with_its_own_worker():
    replicas = _replicas()
    assert replicas["spec"]["replicas"] >= 2
    assert not [d for d in _documents() if d["kind"] == "StatefulSet"], "no shared workers"
    worker = worker_parser().parse_args(_args(_container(replicas, "worker")))
    config_from_args(worker, model="unused")
    assert worker.host == "127.0.0.1"
    assert _scheduler_args().worker == [f"127.0.0.1:{worker.port}"]


def test_the_pool_selects_the_replicas_on_their_http_port():
    pool = _one("InferencePool", "cbserve")["spec"]
    labels = _replicas()["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert labels[ENGINE_LABEL[0]] == ENGINE_LABEL[1]
    (port,) = pool["targetPorts"]
    assert port["number"] == _scheduler_args().http_port
    # Nothing but the replicas carries the pool's labels (the EPP is not a member).
    members = [d["metadata"]["name"] for d in _documents() if d["kind"] == "Deployment"
               and pool["selector"]["matchLabels"].items()
               <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert members == ["cbserve-scheduler"]


def test_the_picker_reference_is_the_epp_service():
    reference = _one("InferencePool", "cbserve")["spec"]["endpointPickerRef"]
    service = _one("Service", reference["name"])
    epp = _one("Deployment", "cbserve-epp")
    assert (
        service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    )
    (ext_proc,) = [p for p in service["spec"]["ports"] if p["port"] == reference["portNumber"]]
    container_ports = {p["name"]: p["containerPort"] for p in _container(epp, "epp")["ports"]}
    assert container_ports[ext_proc["targetPort"]] == reference["portNumber"] == 9002
    args = _args(_container(epp, "epp"))
    assert args[args.index("--pool-name") + 1] == "cbserve"
    mount = _container(epp, "epp")["volumeMounts"][0]["mountPath"]
    assert args[args.index("--config-file") + 1] == f"{mount}/epp-config.yaml"


def test_the_route_sends_everything_to_the_pool():
    (rule,) = _one("HTTPRoute", "cbserve")["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", "cbserve",
    )  # fmt: skip


def test_kv_events_reach_the_precise_prefix_scorer():
    scheduler = _container(_replicas(), "scheduler")
    events = json.loads(_environment(scheduler)[KV_EVENTS_VARIABLE])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    # POD_IP is defined before the variable that uses it, or the kubelet leaves $(POD_IP).
    names = [variable["name"] for variable in scheduler["env"]]
    assert names.index("POD_IP") < names.index(KV_EVENTS_VARIABLE)
    assert events["topic"] == f"kv@10.0.0.7:{_scheduler_args().http_port}@SmolLM2-135M-Instruct"
    ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    assert events["endpoint"] == f"tcp://*:{ports['kv-events']}"
    assert events["replay_endpoint"] == f"tcp://*:{ports['kv-replay']}"

    scorer = _plugin("precise-prefix-cache-scorer")
    discovery = scorer["kvEventsConfig"]["podDiscoveryConfig"]
    assert discovery["socketPort"] == ports["kv-events"]
    assert discovery["podLabelSelector"] == "=".join(ENGINE_LABEL)
    assert discovery["podNamespace"] == _replicas()["metadata"]["namespace"]
    assert events["topic"].startswith(scorer["kvEventsConfig"]["topicFilter"])
    block_size = _environment(_container(_replicas(), "worker"))["CBSERVE_WORKER_BLOCK_SIZE"]
    assert scorer["tokenProcessorConfig"]["blockSize"] == int(block_size)


def test_kv_events_config_is_accepted_by_the_scheduler_when_it_has_the_flag():
    # --kv-events-config comes with issue 33's KV events (another branch); once merged,
    # its own parser checks the JSON the manifest gives.
    kv_events = pytest.importorskip("scheduler_svc.config.kv_events")
    scheduler = _container(_replicas(), "scheduler")
    parsed = kv_events.parse_kv_events_config(_environment(scheduler)[KV_EVENTS_VARIABLE])
    assert parsed.enable_kv_cache_events


def test_the_epp_tokenizes_with_a_replicas_render_routes():
    url = _plugin("token-producer")["vllmHTTP"]["url"]
    service = _one("Service", "cbserve")
    http = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert url == f"http://cbserve.{service['metadata']['namespace']}.svc.cluster.local:{http}"
    assert http == _scheduler_args().http_port
    profile = _epp_config()["schedulingProfiles"][0]["plugins"]
    scored = {p["pluginRef"] for p in profile}
    assert {"precise-prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer",
            "max-score-picker"} <= scored  # fmt: skip
    declared = {p["type"] for p in _epp_config()["plugins"]}
    assert scored <= declared


def test_the_epp_reads_cbserves_metrics_through_the_shipped_engine_config():
    shipped = yaml.safe_load((K8S_DIR / "inference-gateway" / "engine-config.yaml").read_text())
    assert _plugin("core-metrics-extractor") == shipped["parameters"]
    (entry,) = shipped["parameters"]["engineConfigs"]
    assert entry["name"] == ENGINE_LABEL[1]
    assert shipped["parameters"]["engineLabelKey"] == ENGINE_LABEL[0]
