"""Render a kustomization the way `kustomize build` does, for the features deploy/k8s uses.

    python deploy/render_kustomize.py deploy/k8s/overlays/gpu > gpu.yaml

Why this exists: CI must render the manifests to validate them, and neither kustomize
nor kubectl is on PyPI (the PyPI package named `kustomize` generates kustomizations,
it does not build them). Where kubectl is installed, tests/test_k8s_manifests.py checks
that this renderer's output equals `kubectl kustomize`.

Supported, and nothing else (an unknown key is an error, never silently ignored):
resources (files and kustomization directories), namespace, labels (pairs, metadata
only), configMapGenerator (literals; behavior create or merge; the name hash suffix
and the references to it), patches (strategic merge from a file, lists of named
items merged by name) and images (newName, newTag, digest).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import yaml

SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "configMapGenerator",
    "patches",
    "images",
}
# kustomize's default ("legacy") output order, for the kinds deploy/k8s has; other
# kinds follow, sorted by kind.
KIND_ORDER = [
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Secret",
    "Service",
    "Deployment",
    "StatefulSet",
    "PodDisruptionBudget",
]
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}


class KustomizeError(Exception):
    pass


def _load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _key(resource: dict) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def _strategic_merge(target, patch):
    """Maps merge key by key; a list whose items all have a `name` (containers, env,
    ports, volumes) merges item by item; any other list or value replaces."""
    if isinstance(target, dict) and isinstance(patch, dict):
        merged = dict(target)
        for key, value in patch.items():
            merged[key] = _strategic_merge(target[key], value) if key in target else value
        return merged
    if _named_list(target) and _named_list(patch):
        merged = [copy.deepcopy(item) for item in target]
        positions = {item["name"]: index for index, item in enumerate(merged)}
        for item in patch:
            if item["name"] in positions:
                index = positions[item["name"]]
                merged[index] = _strategic_merge(merged[index], item)
            else:
                merged.append(item)
        return merged
    return copy.deepcopy(patch)


def _named_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)


def _containers(resource: dict) -> list[dict]:
    if resource["kind"] not in WORKLOADS:
        return []
    pod = resource["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _set_image(container: dict, rule: dict) -> None:
    image = container["image"]
    name, digest = image.split("@", 1) if "@" in image else (image, None)
    # A ":" after the last "/" is a tag; one before it is a registry port.
    tag = None
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != rule["name"]:
        return
    name = rule.get("newName", name)
    if "digest" in rule:
        container["image"] = f"{name}@{rule['digest']}"
    elif "newTag" in rule:
        container["image"] = f"{name}:{rule['newTag']}"
    else:
        container["image"] = name + (f"@{digest}" if digest else f":{tag}" if tag else "")


def _literal_data(generator: dict) -> dict[str, str]:
    data = {}
    for literal in generator.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"configMapGenerator literal without '=': {literal!r}")
        data[key] = value
    return data


def config_map_hash(config_map: dict) -> str:
    """kustomize's name suffix: sha256 of the JSON of kind, name and data, first ten
    hex digits with 0 1 3 a e swapped for letters (no all-digit or vowel-made words).
    kustomize v5 reads the name through a path lookup that finds nothing, so the name
    it hashes is "" (checked against kubectl kustomize in the tests)."""
    encoded = json.dumps(
        {"data": config_map.get("data", {}), "kind": "ConfigMap", "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    # Go's json.Marshal escapes these three; Python's json does not.
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


class _Build:
    """Resources of one kustomization, with the generated ConfigMaps remembered by
    name so that the top level can give them their hash suffix once, at the end,
    after every overlay has merged into them."""

    def __init__(self) -> None:
        self.resources: list[dict] = []
        self.generated: set[str] = set()


def _build(directory: Path) -> _Build:
    kustomization_file = directory / "kustomization.yaml"
    if not kustomization_file.exists():
        raise KustomizeError(f"no kustomization.yaml in {directory}")
    kustomization = yaml.safe_load(kustomization_file.read_text()) or {}
    unsupported = set(kustomization) - SUPPORTED_KEYS
    if unsupported:
        raise KustomizeError(f"{kustomization_file}: unsupported keys {sorted(unsupported)}")

    build = _Build()
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            inner = _build(path)
            build.resources += inner.resources
            build.generated |= inner.generated
        else:
            build.resources += _load_documents(path)

    for generator in kustomization.get("configMapGenerator", []):
        unknown = set(generator) - {"name", "literals", "behavior"}
        if unknown:
            raise KustomizeError(f"configMapGenerator: unsupported keys {sorted(unknown)}")
        behavior = generator.get("behavior", "create")
        existing = [r for r in build.resources if _key(r) == ("ConfigMap", generator["name"])]
        if behavior == "merge":
            if not existing:
                raise KustomizeError(f"behavior merge: no ConfigMap {generator['name']} to merge")
            existing[0].setdefault("data", {}).update(_literal_data(generator))
        elif behavior == "create":
            if existing:
                raise KustomizeError(f"ConfigMap {generator['name']} already exists")
            config_map = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": _literal_data(generator),
            }
            build.resources.append(config_map)
            build.generated.add(generator["name"])
        else:
            raise KustomizeError(f"configMapGenerator: unsupported behavior {behavior!r}")

    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"patches: only `path` is supported, got {patch_entry}")
        for patch in _load_documents(directory / patch_entry["path"]):
            matches = [i for i, r in enumerate(build.resources) if _key(r) == _key(patch)]
            if len(matches) != 1:
                raise KustomizeError(f"patch {patch_entry['path']}: {_key(patch)} not found")
            index = matches[0]
            build.resources[index] = _strategic_merge(build.resources[index], patch)

    if "namespace" in kustomization:
        for resource in build.resources:
            if resource["kind"] == "Namespace":
                resource["metadata"]["name"] = kustomization["namespace"]
            elif resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = kustomization["namespace"]

    for label_set in kustomization.get("labels", []):
        if set(label_set) != {"pairs"}:
            raise KustomizeError(f"labels: only `pairs` is supported, got {sorted(label_set)}")
        for resource in build.resources:
            resource["metadata"].setdefault("labels", {}).update(label_set["pairs"])

    for rule in kustomization.get("images", []):
        for resource in build.resources:
            for container in _containers(resource):
                _set_image(container, rule)
    return build


def _rename_config_map_references(resource: dict, renamed: dict[str, str]) -> None:
    if resource["kind"] not in WORKLOADS:
        return
    pod = resource["spec"]["template"]["spec"]
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            ref = volume["configMap"]
            ref["name"] = renamed.get(ref["name"], ref["name"])
    for container in _containers(resource):
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                ref = source["configMapRef"]
                ref["name"] = renamed.get(ref["name"], ref["name"])
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                ref["name"] = renamed.get(ref["name"], ref["name"])


def render(directory: str | Path) -> list[dict]:
    """Every resource of the kustomization in `directory`, as `kustomize build` emits it."""
    build = _build(Path(directory).resolve())
    renamed = {}
    for resource in build.resources:
        if resource["kind"] == "ConfigMap" and resource["metadata"]["name"] in build.generated:
            name = resource["metadata"]["name"]
            renamed[name] = f"{name}-{config_map_hash(resource)}"
            resource["metadata"]["name"] = renamed[name]
    for resource in build.resources:
        _rename_config_map_references(resource, renamed)

    def order(resource: dict) -> tuple:
        kind = resource["kind"]
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return rank, kind, resource["metadata"].get("namespace", ""), resource["metadata"]["name"]

    return sorted(build.resources, key=order)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python deploy/render_kustomize.py KUSTOMIZATION_DIR", file=sys.stderr)
        return 2
    try:
        documents = render(args[0])
    except (KustomizeError, OSError, KeyError) as error:
        print(f"render_kustomize: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
