"""Offline schemas for the custom resources deploy/k8s renders, which the Kubernetes
schemas that kubernetes-validate bundles do not cover.

kubernetes-validate knows only built-in kinds: an InferencePool or an HTTPRoute is a
WARN there and nothing is checked. These JSON schemas, written from the API types and
strict like `kubernetes-validate --strict` (an unknown or misspelt field fails), cover
the fields cbserve's manifests use:

- InferencePool, inference.networking.k8s.io/v1: kubernetes-sigs/gateway-api-inference-
  extension api/v1/inferencepool_types.go (at 00a90599): selector.matchLabels,
  targetPorts (exactly one, number 1-65535), endpointPickerRef (group, kind, name,
  portNumber, failureMode FailOpen|FailClose);
- HTTPRoute, gateway.networking.k8s.io/v1: Gateway API's HTTPRoute spec (parentRefs,
  rules with matches, backendRefs and timeouts), as the inference extension's chart
  writes one to an InferencePool.

`python tests/k8s_crds.py RENDERED CORE` (make deploy-check) checks the custom resources
in RENDERED against these and writes every other document to CORE, for
kubernetes-validate.
"""

from __future__ import annotations

import sys

import jsonschema
import yaml

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "namespace": _NAME,
        "labels": _LABELS,
        "annotations": _LABELS,
    },  # fmt: skip
    "additionalProperties": False,
}


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}  # fmt: skip


def _resource(api_version: str, kind: str, spec: dict) -> dict:
    return _object(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind},
         "metadata": _METADATA, "spec": spec},
        ("apiVersion", "kind", "metadata", "spec"),
    )  # fmt: skip


INFERENCE_POOL = _resource(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    _object(
        {
            "selector": _object(
                {"matchLabels": {**_LABELS, "minProperties": 1}}, ("matchLabels",)
            ),  # fmt: skip
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": _object({"number": _PORT}, ("number",)),
            },  # fmt: skip
            "endpointPickerRef": _object(
                {
                    "group": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": _NAME,
                    "portNumber": _PORT,
                    "failureMode": {"enum": ["FailOpen", "FailClose"]},
                },
                ("name",),
            ),  # fmt: skip
        },
        ("selector", "targetPorts", "endpointPickerRef"),
    ),
)

_PARENT_REF = _object(
    {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
     "namespace": _NAME, "sectionName": _NAME, "port": _PORT},
    ("name",),
)  # fmt: skip
_BACKEND_REF = _object(
    {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
     "namespace": _NAME, "port": _PORT, "weight": {"type": "integer", "minimum": 0}},
    ("name",),
)  # fmt: skip
_MATCH = _object(
    {"path": _object({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                      "value": {"type": "string"}})},
)  # fmt: skip
_DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
HTTP_ROUTE = _resource(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    _object(
        {
            "parentRefs": {"type": "array", "items": _PARENT_REF, "maxItems": 32},
            "hostnames": {"type": "array", "items": {"type": "string"}},
            "rules": {
                "type": "array",
                "maxItems": 16,
                "items": _object(
                    {
                        "matches": {"type": "array", "items": _MATCH},
                        "backendRefs": {"type": "array", "items": _BACKEND_REF},
                        "timeouts": _object({"request": _DURATION, "backendRequest": _DURATION}),
                    },
                ),  # fmt: skip
            },
        },
    ),
)

SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
}


def is_custom(document: dict) -> bool:
    return (document.get("apiVersion"), document.get("kind")) in SCHEMAS


def validate(document: dict) -> None:
    """Raises jsonschema.ValidationError naming the first bad field."""
    jsonschema.validate(document, SCHEMAS[(document["apiVersion"], document["kind"])])


def main(rendered: str, core: str) -> int:
    with open(rendered) as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d]
    for document in filter(is_custom, documents):
        try:
            validate(document)
        except jsonschema.ValidationError as error:
            where = ".".join(str(part) for part in error.absolute_path)
            print(f"{rendered}: {document['kind']}/{document['metadata']['name']}: {where}: "
                  f"{error.message}", file=sys.stderr)  # fmt: skip
            return 1
        print(f"  {document['kind']}/{document['metadata']['name']} passes its schema "
              "(tests/k8s_crds.py, strict)")  # fmt: skip
    with open(core, "w") as stream:
        yaml.safe_dump_all([d for d in documents if not is_custom(d)], stream)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
