"""Generate the TuningRun CustomResourceDefinition from the pydantic models.

The API server wants a *structural* OpenAPI v3 schema: every node typed, no `$ref`,
no `anyOf` for nullability, integer-or-anything fields marked with
`x-kubernetes-preserve-unknown-fields`. Pydantic emits JSON Schema 2020-12, so this
module rewrites one into the other. `crds/tuningrun.yaml` is this module's output;
a unit test fails when they differ (run `fleettune crd > crds/tuningrun.yaml`).
"""

from __future__ import annotations

import argparse
import sys
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


def render() -> str:
    header = "# Generated by `fleettune crd` from operator/fleettune/api.py. Do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune crd", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    sys.stdout.write(render())
    return 0
