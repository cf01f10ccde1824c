"""Generate the TuningRun CustomResourceDefinition from the pydantic models.

The API server wants a *structural* OpenAPI v3 schema: every node typed, no `$ref`,
no `anyOf` for nullability, integer-or-anything fields marked with
`x-kubernetes-preserve-unknown-fields`. Pydantic emits JSON Schema 2020-12, so this
module rewrites one into the other. `crds/tuningrun.yaml` is this module's output;
a unit test fails when they differ (run `fleettune crd > crds/tuningrun.yaml`).

Fields of Kubernetes types (a target's `affinity` and `tolerations`) carry the real
schemas of those types, as the API server publishes them, inlined: `fleettune.api.kubernetes`
is generated from a kube-apiserver's /openapi/v3/api/v1 by `fleettune crd
--kubernetes-openapi FILE` (an integration test compares it with the live one).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from fleettune import GROUP, KIND, PLURAL, VERSION
from fleettune.api import TuningRunSpec, TuningRunStatus

_DROP = {"title", "additionalProperties", "$defs"}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Trials", "type": "string", "jsonPath": ".status.progress", "description": "recorded / budget"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    # Why (not) Ready: a Succeeded run whose ConfigMap was refused shows False and PublishRefused.
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Best", "type": "string", "jsonPath": ".status.bestSummary", "description": "best time per pool"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            return _structural({**options[0], **rest}, defs)
        # A union of several types (e.g. `Any`-like values): let the operator validate it.
        return _structural({**rest, "x-kubernetes-preserve-unknown-fields": True}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "default" and (isinstance(value, dict | list) or value is None):
            continue  # object defaults are filled by the models; keep the stored object small
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        out[key] = _structural(value, defs) if key in ("properties", "items") or isinstance(value, dict) else value
    if "properties" in out:
        out["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
        out["type"] = "object"
    elif node.get("type") == "object" or ("type" not in out and "enum" not in out):
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra.get("type") in ("string", "integer", "number", "boolean"):
            out["additionalProperties"] = {"type": extra["type"]}
            out["type"] = "object"
        else:
            out.pop("type", None)
            out["x-kubernetes-preserve-unknown-fields"] = True
            if node.get("type") == "object" or isinstance(extra, dict):
                out["type"] = "object"
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec_schema = model_schema(TuningRunSpec)
    status_schema = model_schema(TuningRunStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["tr", "tune"],
                "categories": ["fleettune"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A GPU kernel tuned on one or more node pools.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


# The Kubernetes types whose schemas the TuningRun's spec uses (fleettune.api.kubernetes).
KUBERNETES_TYPES = {"AFFINITY": "io.k8s.api.core.v1.Affinity", "TOLERATION": "io.k8s.api.core.v1.Toleration"}
# What a CRD's JSONSchemaProps can hold of an OpenAPI schema; anything else fails the
# conversion, so that a newer API server's schema is looked at rather than half-copied.
_KUBE_KEPT = {
    "description", "type", "format", "properties", "items", "required", "enum", "additionalProperties",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-int-or-string",
}
# Defaults mark Go zero values (`{}`, `""`, 0) and would be stored into every object;
# patch strategies and unions are for strategic merge patch, which custom resources lack.
_KUBE_DROPPED = {
    "default", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-unions",
    "x-kubernetes-group-version-kind",
}


def kubernetes_schema(openapi: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The structural schema of Kubernetes type ``name`` (e.g. io.k8s.api.core.v1.Affinity)
    from an API server's OpenAPI v3 document: references inlined, defaults dropped. An
    optional string field with an enum also takes "" (Kubernetes reads an unset field as
    empty: `effect: ""` tolerates every taint effect)."""
    schemas: Mapping[str, Any] = openapi["components"]["schemas"]

    def resolve(ref: str, path: str, depth: int) -> dict[str, Any]:
        if depth > 32:
            raise ValueError(f"{name}: {path}: references nest too deep (a recursive type?)")
        return inline(schemas[ref.rsplit("/", 1)[-1]], path, depth + 1)

    def inline(node: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        node = dict(node)
        base: dict[str, Any] = {}
        if "allOf" in node:
            parts = node.pop("allOf")
            if len(parts) != 1 or set(parts[0]) != {"$ref"}:
                raise ValueError(f"{name}: {path}: allOf other than one $ref")
            base = resolve(parts[0]["$ref"], path, depth)
        if "$ref" in node:
            base = resolve(node.pop("$ref"), path, depth)
        out = dict(base)
        for key, value in node.items():
            if key in _KUBE_DROPPED:
                continue
            if key not in _KUBE_KEPT:
                raise ValueError(f"{name}: {path}: {key!r} is not converted into a CRD schema")
            if key == "properties":
                out[key] = {k: inline(v, f"{path}.{k}", depth) for k, v in value.items()}
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = inline(value, f"{path}[]", depth)
            else:
                out[key] = value  # the outer description wins over the referenced type's
        required = set(out.get("required") or ())
        for field, prop in (out.get("properties") or {}).items():
            if field not in required and prop.get("type") == "string" and "" not in prop.get("enum", [""]):
                prop["enum"] = ["", *prop["enum"]]
        return out

    return inline(schemas[name], name, 0)


def render_kubernetes_schemas(openapi: Mapping[str, Any]) -> str:
    """fleettune/api/kubernetes.json from an API server's /openapi/v3/api/v1."""
    info = openapi.get("info") or {}
    source = f"{info.get('title', 'Kubernetes')} {info.get('version', '')} /openapi/v3/api/v1".strip()
    doc: dict[str, Any] = {"source": source}
    for var, type_name in KUBERNETES_TYPES.items():
        doc[var] = kubernetes_schema(openapi, type_name)
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


class _NoAliases(yaml.SafeDumper):
    """Schemas used twice (the arguments of CUDA and Triton source) are written out in full:
    the API server does not read YAML anchors in the stored object's meaning of a reader."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `fleettune crd` from operator/fleettune/api/. Do not edit by hand.\n"
    return header + yaml.dump(build_crd(), Dumper=_NoAliases, sort_keys=False, width=100)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune crd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubernetes-openapi", metavar="FILE",
        help="instead, print fleettune/api/kubernetes.json generated from FILE, a kube-apiserver's "
        "/openapi/v3/api/v1 (`kubectl get --raw /openapi/v3/api/v1`)",
    )
    args = parser.parse_args(argv)
    if args.kubernetes_openapi:
        with open(args.kubernetes_openapi) as f:
            sys.stdout.write(render_kubernetes_schemas(json.load(f)))
        return 0
    sys.stdout.write(render())
    return 0
