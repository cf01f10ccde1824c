"""Every example a user may copy must parse, build its space on each pool and fit its kernel,
and `kubectl apply -f examples/` must apply all of them: each document a Kubernetes object of a
kind the cluster knows (the TuningRun CRD's, or a core kind)."""

import re
from pathlib import Path

import pytest
import yaml

from fleettune.api import TuningRunSpec
from fleettune.space import SearchSpace, lookup_device
from fleettune_job.kernels import BUILTINS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCUMENTS = [
    (f"{path.name}[{i}]", doc)
    for path in sorted(EXAMPLES.iterdir())
    if path.suffix in (".yaml", ".yml", ".json")
    for i, doc in enumerate(yaml.safe_load_all(path.read_text()))
    if doc is not None
]
# Core kinds an example may hold next to its TuningRun (its kernel's source, its data).
CORE_KINDS = {("v1", "ConfigMap"), ("v1", "Secret")}
RUNS = [
    (path.name, doc)
    for path in sorted(EXAMPLES.glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc and doc.get("kind") == "TuningRun"
]
# The demo fleet's GPUs, keyed by what the examples select pools by.
PRODUCTS = {"a100": "NVIDIA-A100-PCIE-40GB", "rtx-a4000": "NVIDIA-RTX-A4000", "jetson-orin": "Jetson-AGX-Orin"}


def test_there_are_examples():
    assert len(RUNS) >= 3


@pytest.mark.parametrize(("name", "doc"), RUNS, ids=[n for n, _ in RUNS])
def test_example_spaces_build_on_every_pool_and_defaults_are_valid(name, doc):
    spec = TuningRunSpec.model_validate(doc["spec"])
    params = [p.dump() for p in spec.parameters]
    for target in spec.targets:
        space = SearchSpace.from_spec(params, list(spec.constraints), lookup_device(PRODUCTS[target.name]))
        assert space.count() > 0
        if spec.kernel.default_config is not None:
            assert space.is_valid(space.to_rows([spec.kernel.default_config]))[0], (name, target.name)


@pytest.mark.parametrize(("name", "doc"), RUNS, ids=[n for n, _ in RUNS])
def test_example_tunes_exactly_its_builtin_kernels_parameters(name, doc):
    spec = TuningRunSpec.model_validate(doc["spec"])
    if spec.kernel.builtin is None:
        pytest.skip("a user kernel: its parameters are its own (test_user_kernel_example_passes_the_operators_checks)")
    builtin = BUILTINS[spec.kernel.builtin]
    assert {p.name for p in spec.parameters} == {p.name for p in builtin.parameters}
    if spec.kernel.default_config is not None:
        assert spec.kernel.default_config == {p.name: p.default for p in builtin.parameters}


def test_user_kernel_example_passes_the_operators_checks():
    from fleettune.kernelcheck import check_kernel, check_source_data, compile_check
    from fleettune_job import nvrtc

    source_map, run = yaml.safe_load_all((EXAMPLES / "user-kernel.yaml").read_text())
    spec = TuningRunSpec.model_validate(run["spec"])
    check_kernel(spec)
    text = check_source_data(spec, source_map["data"])
    assert spec.kernel.source is not None and spec.kernel.source.config_map == source_map["metadata"]["name"]
    if nvrtc.available():
        for target in spec.targets:
            cc = lookup_device(PRODUCTS[target.name]).cc
            assert compile_check(spec, text, cc, spec.kernel.sizes()[0]) is None


def _crd_kinds() -> set[tuple[str, str]]:
    """(apiVersion, kind) of every served version of the CRDs a user installs (crds/)."""
    kinds = set()
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            assert crd["kind"] == "CustomResourceDefinition", path
            spec = crd["spec"]
            kinds |= {(f"{spec['group']}/{v['name']}", spec["names"]["kind"]) for v in spec["versions"] if v["served"]}
    return kinds


def test_every_yaml_file_under_examples_is_checked():
    assert {p.name for p in EXAMPLES.iterdir()} == {n.split("[")[0] for n, _ in DOCUMENTS}, "a file holds no document"
    assert ("fleettune.dev/v1alpha1", "TuningRun") in _crd_kinds()


@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[n for n, _ in DOCUMENTS])
def test_every_example_document_is_an_object_the_cluster_knows(name, doc):
    """What `kubectl apply -f examples/` (or an Argo CD application on the folder) applies."""
    assert isinstance(doc, dict), f"{name}: not an object"
    kind = (doc.get("apiVersion"), doc.get("kind"))
    assert kind in _crd_kinds() | CORE_KINDS, f"{name}: {kind} is neither the TuningRun CRD's nor a core kind"
    meta = doc.get("metadata") or {}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", meta.get("name") or ""), f"{name}: metadata.name"
    # No namespace of its own: `kubectl apply -n NS -f examples/` puts every object in NS.
    assert "namespace" not in meta, f"{name}: sets metadata.namespace"
    if kind[1] == "TuningRun":
        TuningRunSpec.model_validate(doc["spec"])
