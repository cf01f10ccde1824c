"""Every example a user may copy must parse, build its space on each pool and fit its kernel."""

from pathlib import Path

import pytest
import yaml

from fleettune.api import TuningRunSpec
from fleettune.space import SearchSpace, lookup_device
from fleettune_job.kernels import BUILTINS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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
