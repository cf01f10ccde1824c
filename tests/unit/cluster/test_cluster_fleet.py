"""The fleet file model: defaults, node manifests, and errors that name the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from fleettune_dev.cluster.fleet import (
    DEFAULT_FLEET_FILE,
    POOL_LABEL,
    FleetError,
    default_fleet,
    label_value,
    load_fleet,
    packaged_data_dir,
    packaged_recordings_dir,
    parse_fleet,
)

ROOT = Path(__file__).resolve().parents[3]


def _minimal(**pool: object) -> dict:
    base = {
        "name": "p",
        "nodes": 1,
        "gpu": {"product": "NVIDIA RTX A4000", "computeCapability": "8.6", "memoryMiB": 16376,
                "perNode": 2, "driverVersion": "535.0", "cudaRuntimeVersion": "12.2"},
    }
    return {"apiVersion": "fleettune.dev/v1alpha1", "kind": "Fleet", "pools": [base | pool]}


def test_default_fleet_has_the_three_demo_pools():
    fleet = default_fleet()
    assert fleet.pool_names() == ["a100", "rtx-a4000", "jetson-orin"]
    assert [(p.nodes, p.gpu.per_node, p.arch) for p in fleet.pools] == [
        (2, 4, "amd64"), (2, 2, "amd64"), (2, 1, "arm64")]
    assert len(fleet.node_manifests()) == 6


def test_the_demo_fleet_file_is_the_default_and_stays_out_of_examples():
    """The fleet file is the simulator's, not a Kubernetes object: it is kept with the development
    tools (what `cluster up --fleet` points to), never under examples/ (`kubectl apply -f examples/`)."""
    packaged = (packaged_data_dir() / DEFAULT_FLEET_FILE).resolve()
    assert packaged == (ROOT / "dev" / "fleettune_dev" / "data" / "fleet-demo.yaml").resolve()
    assert load_fleet(packaged).pool_names() == default_fleet().pool_names()
    assert not any(doc and doc.get("kind") == "Fleet" for path in (ROOT / "examples").glob("*.yaml")
                   for doc in yaml.safe_load_all(path.read_text()))


def test_gpu_nodes_carry_gfd_labels_and_capacity():
    node = default_fleet().pool("a100").node_manifest("a100-0")
    labels = node["metadata"]["labels"]
    assert labels[POOL_LABEL] == "a100"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-PCIE-40GB"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("8", "0")
    assert labels["nvidia.com/gpu.memory"] == "40960"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/cuda.driver-version.full"]
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.4"
    assert labels["kubernetes.io/arch"] == "amd64"
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/hostname"] == "a100-0"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert {"cpu", "memory", "pods"} <= set(node["status"]["capacity"])
    assert "taints" not in node["spec"]


def test_jetson_nodes_have_project_labels_instead_of_gfd_and_a_taint():
    pool = default_fleet().pool("jetson-orin")
    node = pool.node_manifest("jetson-orin-1")
    labels = node["metadata"]["labels"]
    assert not [k for k in labels if k.startswith("nvidia.com/")], "GFD does not run on Jetson"
    assert labels["fleettune.dev/gpu.product"] == "Jetson-AGX-Orin"
    assert labels["fleettune.dev/jetson.l4t-version"]
    assert labels["fleettune.dev/cuda.driver-version.full"]
    assert labels["kubernetes.io/arch"] == "arm64"
    assert node["spec"]["taints"] == [{"key": "edge", "value": "true", "effect": "NoSchedule"}]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "1"
    assert pool.simulation.synthetic["convolution"].source == "convolution_milo-A4000"


def test_label_value_uses_dashes_like_gfd():
    assert label_value("NVIDIA RTX A4000") == "NVIDIA-RTX-A4000"
    assert label_value(" Tesla V100-SXM2-16GB ") == "Tesla-V100-SXM2-16GB"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"nodes": 0}, "pools[0].nodes"),
        ({"name": "Bad_Name"}, "pools[0].name"),
        ({"arch": "riscv"}, "pools[0].arch"),
        ({"gpu": {"product": "x"}}, "pools[0].gpu.computeCapability"),
        ({"gpus": 3}, "pools[0].gpus"),
        ({"taints": [{"key": "a", "effect": "Sometimes"}]}, "pools[0].taints[0].effect"),
        ({"labels": {"a": "not valid!"}}, "pools[0].labels"),
    ],
)
def test_invalid_fleet_names_the_field(change, where):
    with pytest.raises(FleetError) as err:
        parse_fleet(_minimal(**change), source="f.yaml")
    assert str(err.value).startswith("f.yaml: invalid fleet file")
    assert where in str(err.value)


def test_duplicate_pools_and_kernels_with_two_sources_are_rejected():
    doc = _minimal()
    doc["pools"].append(dict(doc["pools"][0]))
    with pytest.raises(FleetError, match="used twice"):
        parse_fleet(doc)
    sim = {"recordings": {"convolution": "convolution_milo-A100"},
           "synthetic": {"convolution": {"from": "convolution_milo-A100", "slowdown": 2}}}
    with pytest.raises(FleetError, match="both a recording and a synthetic model"):
        parse_fleet(_minimal(simulation=sim))


def test_unknown_recording_is_an_error_at_load_time():
    with pytest.raises(FleetError, match=r"no packaged recording named 'nope'.*convolution_milo-A100"):
        parse_fleet(_minimal(simulation={"recordings": {"convolution": "nope"}}))


def test_relative_recording_paths_resolve_against_the_fleet_file(tmp_path):
    shutil.copy(packaged_recordings_dir() / "convolution_milo-A100.json.gz", tmp_path / "mine.json.gz")
    doc = _minimal(simulation={"recordings": {"convolution": "./mine.json.gz"}})
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    assert fleet.recording_path("./mine.json.gz") == tmp_path / "mine.json.gz"
    # The saved copy (state dir of a cluster) must still find it from elsewhere.
    again = parse_fleet(yaml.safe_load(fleet.to_yaml()), base_dir=Path("/"))
    assert again.recording_path(again.pools[0].simulation.recordings["convolution"]).samefile(
        tmp_path / "mine.json.gz")


def test_unreadable_or_non_yaml_files_raise_fleet_error(tmp_path):
    with pytest.raises(FleetError, match="cannot read fleet file"):
        load_fleet(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("pools: [")
    with pytest.raises(FleetError, match="not valid YAML"):
        load_fleet(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(FleetError, match="must be a YAML mapping"):
        load_fleet(tmp_path / "list.yaml")


def test_to_yaml_round_trips():
    fleet = default_fleet()
    again = parse_fleet(yaml.safe_load(fleet.to_yaml()))
    assert again.node_manifests() == fleet.node_manifests()
    assert again.pools == fleet.pools
