from pathlib import Path

import pytest
import yaml

from fleettune.api import TuningRunSpec
from fleettune.controller.spec import SpecError, parse_spec
from fleettune.crd import build_crd, render

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_models():
    committed = (ROOT / "crds" / "tuningrun.yaml").read_text()
    assert committed == render(), "run `fleettune crd > crds/tuningrun.yaml`"


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "$defs" not in node, path
        if path.endswith(".properties") or path.endswith("x-kubernetes-validations"):
            continue
        if ("properties" in node or "items" in node) and not path.endswith(".properties"):
            assert node.get("type") in ("object", "array"), path


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse_into_the_models(path):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "TuningRun":
            spec = TuningRunSpec.model_validate(doc["spec"])
            assert spec.targets and spec.parameters


def test_spec_errors_name_the_field():
    doc = yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"]
    doc["budget"]["parallelism"] = 0
    with pytest.raises(SpecError, match=r"spec\.budget\.parallelism"):
        parse_spec(doc)
    doc["budget"]["parallelism"] = 2
    doc["parameters"][2]["type"] = "complex"
    with pytest.raises(SpecError, match=r"spec\.parameters\[2\]\.type"):
        parse_spec(doc)


def _schema():
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("part", ["spec", "status"])
def test_every_field_is_described_for_kubectl_explain(part):
    spec = _schema()["properties"][part]
    undescribed = []

    def visit(node, path):
        for name, prop in (node.get("properties") or {}).items():
            if not prop.get("description"):
                undescribed.append(f"{path}.{name}")
            visit(prop, f"{path}.{name}")
            visit(prop.get("items") or {}, f"{path}.{name}[]")

    visit(spec, part)
    assert not undescribed, f"fields `kubectl explain` shows as <no description>: {undescribed}"


def test_conditions_are_a_map_keyed_by_type_with_date_times():
    status = _schema()["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    # A map key must be required (or defaulted) for the API server to accept the CRD.
    assert "type" in conditions["items"]["required"]
    assert conditions["items"]["properties"]["lastTransitionTime"] == {
        "type": "string", "format": "date-time", "description": "When the status last changed."}
    for name in ("startedAt", "completedAt"):
        assert status["properties"][name]["format"] == "date-time"
    assert status["properties"]["targets"]["items"]["properties"]["roundStartedAt"]["format"] == "date-time"


def test_affinity_and_tolerations_have_the_kubernetes_schemas():
    from fleettune.api import kubernetes

    target = _schema()["properties"]["spec"]["properties"]["targets"]["items"]["properties"]
    affinity = target["affinity"]
    assert {k: v for k, v in affinity.items() if k != "description"} == {
        k: v for k, v in kubernetes.AFFINITY.items() if k != "description"}
    assert affinity["description"].startswith("Affinity of the pool's trial Pods")
    assert target["tolerations"]["items"] == kubernetes.TOLERATION and target["tolerations"]["maxItems"] == 32
    # Nowhere under them may unknown fields be kept: that is what rejects a typo.
    for path, node in _walk(affinity):
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
    assert set(kubernetes.TOLERATION["properties"]) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    # An unset effect or operator is "" in Kubernetes: a valid value here too.
    assert kubernetes.TOLERATION["properties"]["effect"]["enum"][0] == ""


def test_kubernetes_schemas_are_inlined_from_the_api_servers_openapi():
    from fleettune.crd import kubernetes_schema

    ref = "#/components/schemas/"
    openapi = {"components": {"schemas": {
        "v1.Outer": {"type": "object", "description": "outer", "required": ["kind"], "properties": {
            "inner": {"description": "the field's own words", "default": {}, "allOf": [{"$ref": ref + "v1.Inner"}]},
            "items": {"type": "array", "items": {"default": {}, "allOf": [{"$ref": ref + "v1.Inner"}]},
                      "x-kubernetes-list-type": "atomic"},
            "kind": {"type": "string", "enum": ["A", "B"], "default": ""},
            "mode": {"type": "string", "enum": ["X"]},
        }},
        "v1.Inner": {"type": "object", "description": "the type's words", "x-kubernetes-map-type": "atomic",
                     "properties": {"labels": {"type": "object", "additionalProperties": {"type": "string",
                                                                                         "default": ""}}}},
    }}}
    inner = {"type": "object", "description": "the type's words", "x-kubernetes-map-type": "atomic",
             "properties": {"labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
    assert kubernetes_schema(openapi, "v1.Outer") == {
        "type": "object", "description": "outer", "required": ["kind"], "properties": {
            "inner": {**inner, "description": "the field's own words"},
            "items": {"type": "array", "items": inner, "x-kubernetes-list-type": "atomic"},
            "kind": {"type": "string", "enum": ["A", "B"]},  # required: no ""
            "mode": {"type": "string", "enum": ["", "X"]},  # optional: unset is ""
        }}
    openapi["components"]["schemas"]["v1.Inner"]["oneOf"] = []
    with pytest.raises(ValueError, match="'oneOf' is not converted"):
        kubernetes_schema(openapi, "v1.Outer")


def test_the_crd_stays_applicable_by_every_client():
    import json

    crd = build_crd()
    # `kubectl apply` (client-side) keeps the whole object in an annotation: at most 256 KiB.
    assert len(json.dumps(crd, separators=(",", ":"))) < 200 * 1024
    # Helm re-renders 1.0e-06 as 1e-06, which YAML 1.1 reads as a string: no float defaults.
    for path, node in _walk(crd):
        if "default" in node and not path.endswith(".properties"):
            assert not isinstance(node["default"], float), path
