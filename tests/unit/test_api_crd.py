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


def test_every_spec_field_is_described_for_kubectl_explain():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    undescribed = []

    def visit(node, path):
        for name, prop in (node.get("properties") or {}).items():
            if not prop.get("description"):
                undescribed.append(f"{path}.{name}")
            visit(prop, f"{path}.{name}")
            visit(prop.get("items") or {}, f"{path}.{name}[]")

    visit(spec, "spec")
    assert not undescribed, f"fields `kubectl explain` shows as <no description>: {undescribed}"
