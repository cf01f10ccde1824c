"""Node and pool fingerprints from node labels (GFD and the project's Jetson labels)."""

from __future__ import annotations

import pytest

from fleettune.api import Fingerprint as DeviceStatus
from fleettune.api import TunedFor
from fleettune.fingerprint import (
    GpuFingerprint,
    describe_change,
    device_status,
    fingerprint_key,
    from_device,
    is_stale,
    node_eligible,
    node_fingerprint,
    pinning_selector,
    pool_fingerprint,
    relevant_labels,
)
from fleettune_dev.cluster.fleet import default_fleet
from fleettune_job.protocol import Fingerprint as DeviceReport

A100 = {
    "nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gfd.timestamp": "1732200000",
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/hostname": "gpu-1",
}



def test_gfd_labels_of_the_demo_fleet() -> None:
    pool = default_fleet().pool("a100")
    fp = node_fingerprint(pool.node_labels("a100-0"))
    assert fp.product == "NVIDIA-A100-PCIE-40GB"
    assert fp.compute_capability == "8.0"
    assert fp.driver_version == "550.127.05"
    assert fp.cuda_runtime_version == "12.4"
    assert (fp.mig_profile, fp.sharing, fp.arch, fp.family, fp.memory_mib) == ("", "none", "amd64", "ampere", 40960)
    assert fp.source == "gfd"


def test_jetson_uses_the_projects_labels_and_the_catalog_for_compute_capability() -> None:
    pool = default_fleet().pool("jetson-orin")
    labels = pool.node_labels("jetson-orin-0")
    assert not any(k.startswith("nvidia.com/") for k in labels)
    fp = node_fingerprint(labels)
    assert fp.product == "Jetson-AGX-Orin"
    assert fp.driver_version == "540.4.0"
    assert fp.l4t_version == "36.4.0"
    assert fp.arch == "arm64"
    assert fp.compute_capability == "8.7"
    assert fp.source == "fleettune"
    assert node_eligible(labels) == (True, "")


def test_deprecated_driver_labels_are_a_fallback() -> None:
    labels = {k: v for k, v in A100.items() if "version.full" not in k}
    labels |= {"nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "104",
               "nvidia.com/cuda.driver.rev": "05", "nvidia.com/cuda.runtime.major": "12",
               "nvidia.com/cuda.runtime.minor": "2"}
    fp = node_fingerprint(labels)
    assert (fp.driver_version, fp.cuda_runtime_version) == ("535.104.05", "12.2")
    # The full label wins when both exist.
    full = labels | {"nvidia.com/cuda.driver-version.full": "535.104.12"}
    assert node_fingerprint(full).driver_version == "535.104.12"
    # A partial deprecated triple is not a version.
    del labels["nvidia.com/cuda.driver.major"]
    assert node_fingerprint(labels).driver_version == ""


def test_mig_single_and_mixed() -> None:
    single = A100 | {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig.strategy": "single"}
    fp = node_fingerprint(single)
    assert (fp.product, fp.mig_profile, fp.sharing) == ("NVIDIA-A100-SXM4-40GB", "1g.5gb", "none")
    mixed = A100 | {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.20gb.count": "2",
                    "nvidia.com/mig-1g.5gb.count": "1", "nvidia.com/mig-2g.10gb.count": "0"}
    assert node_fingerprint(mixed).mig_profile == "mixed:1g.5gb,3g.20gb"
    assert is_stale(node_fingerprint(A100), node_fingerprint(mixed))


def test_sharing_from_strategy_replicas_and_suffix() -> None:
    mps = A100 | {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"}
    assert node_fingerprint(mps).sharing == "mps"
    assert node_fingerprint(A100 | {"nvidia.com/gpu.replicas": "2"}).sharing == "time-slicing"
    shared = node_fingerprint(A100 | {"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB-SHARED"})
    assert (shared.product, shared.sharing) == ("NVIDIA-A100-PCIE-40GB", "time-slicing")
    both = node_fingerprint(A100 | {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"})
    assert (both.product, both.mig_profile, both.sharing) == ("NVIDIA-A100-SXM4-40GB", "1g.5gb", "time-slicing")
    # Sharing alone does not make results stale: it is an eligibility question.
    assert not is_stale(node_fingerprint(A100), shared)


SLICED = A100 | {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}


@pytest.mark.parametrize(
    ("labels", "unschedulable", "allow_shared", "expected"),
    [
        (A100, False, False, (True, "")),
        (A100 | {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}, False, False, (True, "")),
        (A100 | {"nvidia.com/gpu-driver-upgrade-state": "drain-required"}, False, False,
         (False, "driver upgrade in progress (drain-required)")),
        (A100 | {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}, False, False,
         (False, "driver upgrade in progress (upgrade-failed)")),
        (A100, True, False, (False, "cordoned")),
        (SLICED, False, False, (False, "GPU shared (time-slicing, 4 replicas)")),
        (SLICED, False, True, (True, "")),
        ({"kubernetes.io/arch": "amd64"}, False, False, (False, "no GPU labels")),
    ],
)
def test_node_eligible(labels, unschedulable, allow_shared, expected) -> None:
    assert node_eligible(labels, unschedulable, allow_shared) == expected


def test_relevant_labels_ignore_timestamp_and_unrelated_churn() -> None:
    rel = relevant_labels(A100 | {"nvidia.com/mig-1g.5gb.count": "7", "team": "x"})
    assert "nvidia.com/gfd.timestamp" not in rel
    assert "team" not in rel and "kubernetes.io/hostname" not in rel
    assert rel["nvidia.com/mig-1g.5gb.count"] == "7"
    assert rel["nvidia.com/cuda.driver-version.full"] == "550.54.15"
    assert relevant_labels(A100 | {"nvidia.com/gfd.timestamp": "1732200060"}) == relevant_labels(A100)
    upgrading = A100 | {"nvidia.com/gpu-driver-upgrade-state": "cordon-required"}
    assert relevant_labels(upgrading) != relevant_labels(A100)


def test_stale_and_describe_change() -> None:
    old = node_fingerprint(A100)
    new = node_fingerprint(A100 | {"nvidia.com/cuda.driver-version.full": "560.35.03",
                                   "nvidia.com/cuda.runtime-version.full": "12.6"})
    assert is_stale(old, new)
    assert describe_change(old, new) == "driver 550.54.15 → 560.35.03, CUDA 12.4 → 12.6"
    # Fields that do not change timings do not make results stale.
    same = node_fingerprint(A100 | {"kubernetes.io/arch": "arm64", "nvidia.com/gpu.memory": "40000"})
    assert not is_stale(old, same)
    assert describe_change(old, same) == "no change"
    assert not is_stale(None, new) and not is_stale(old, None)
    assert not is_stale(old, GpuFingerprint())
    assert describe_change(None, old) == "unknown → NVIDIA-A100-PCIE-40GB (8.0), driver 550.54.15, CUDA 12.4"
    jet = node_fingerprint(default_fleet().pool("jetson-orin").node_labels("n"))
    assert is_stale(jet, jet.model_copy(update={"l4t_version": "36.4.3"}))


def test_fingerprint_key_is_short_stable_and_safe() -> None:
    fp = node_fingerprint(A100)
    key = fingerprint_key(fp)
    assert key == "NVIDIA-A100-PCIE-40GB_sm80_drv550.54.15_cuda12.4"
    assert fingerprint_key(node_fingerprint(A100 | {"nvidia.com/gfd.timestamp": "9"})) == key
    mig = node_fingerprint(A100 | {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.20gb.count": "2"})
    assert fingerprint_key(mig).endswith("_migmixed-3g.20gb")


def test_status_round_trip() -> None:
    fp = node_fingerprint(A100)
    status = fp.to_status()
    assert isinstance(status, TunedFor)
    data = status.dump()
    assert data["computeCapability"] == "8.0" and data["driverVersion"] == "550.54.15"
    assert "sharing" not in data and "migProfile" not in data
    assert GpuFingerprint.from_status(status) == GpuFingerprint.from_status(data) == fp
    # JSON written by another version: unknown keys are ignored.
    assert GpuFingerprint.from_status(data | {"futureField": 1}) == fp
    jet = node_fingerprint(default_fleet().pool("jetson-orin").node_labels("n"))
    assert jet.l4t_version and jet.to_status().dump()["l4tVersion"] == jet.l4t_version
    assert GpuFingerprint.from_status(jet.to_status()) == jet
    shared = node_fingerprint(SLICED)
    assert GpuFingerprint.from_status(shared.to_status()) == shared
    assert GpuFingerprint.from_status(GpuFingerprint().to_status()) == GpuFingerprint()


def test_device_report_matches_the_node_labels() -> None:
    # The trial reports the product as the driver names it (spaces); labels use dashes.
    reported = {"product": "NVIDIA A100-PCIE-40GB", "compute_capability": "8.0",
                "driver_version": "550.54.15", "cuda_runtime_version": "12.4", "memory_mib": 40960}
    assert not is_stale(from_device(reported), node_fingerprint(A100))
    assert is_stale(from_device(reported | {"driver_version": "560.35.03"}), node_fingerprint(A100))
    model = DeviceReport(**reported, sm_count=108, simulated=True, unverified=True)
    assert from_device(model) == from_device(reported)
    status = device_status(model)
    assert isinstance(status, DeviceStatus)
    assert status.dump() == {"product": "NVIDIA A100-PCIE-40GB", "computeCapability": "8.0",
                             "driverVersion": "550.54.15", "cudaRuntimeVersion": "12.4", "simulated": True,
                             "synthetic": False, "unverified": True}


def node(labels: dict[str, str], unschedulable: bool = False) -> tuple[dict[str, str], bool]:
    return labels, unschedulable


def test_pool_fingerprint_skips_ineligible_nodes() -> None:
    new = A100 | {"nvidia.com/cuda.driver-version.full": "560.35.03"}
    nodes = [node(A100), node(A100), node(A100 | {"nvidia.com/gpu-driver-upgrade-state": "drain-required"}),
             node(A100, unschedulable=True)]
    pool = pool_fingerprint(nodes)
    assert pool is not None
    assert pool.fingerprint == node_fingerprint(A100)
    assert (pool.eligible, pool.total, pool.mixed) == (2, 4, False)
    assert pool.skipped == {"cordoned": 1, "driver upgrade in progress": 1}
    assert pool_fingerprint([node(A100, True)]) is None
    # Mid-rollout: upgraded nodes are eligible again; the majority wins, mixed says so.
    done = new | {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}
    pool = pool_fingerprint([node(A100), node(A100), node(done)])
    assert pool is not None and pool.mixed and pool.fingerprint.driver_version == "550.54.15"
    assert sorted(pool.variants.values()) == [1, 2]
    # A tie goes to the newer driver: the rollout counts as half done, not undone.
    pool = pool_fingerprint([node(A100), node(new)])
    assert pool is not None and pool.mixed and pool.fingerprint.driver_version == "560.35.03"
    pool = pool_fingerprint([node(new), node(A100)])
    assert pool is not None and pool.fingerprint.driver_version == "560.35.03"
    # Irrelevant differences between nodes do not make a pool mixed.
    pool = pool_fingerprint([node(A100), node(A100 | {"nvidia.com/gpu.memory": "40000"})])
    assert pool is not None and not pool.mixed


def test_pool_fingerprint_shared_nodes_only_when_allowed() -> None:
    shared = A100 | {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"}
    assert pool_fingerprint([node(shared)]) is None
    pool = pool_fingerprint([node(shared)], allow_shared=True)
    assert pool is not None and pool.fingerprint.sharing == "mps"


def test_pinning_selector() -> None:
    assert pinning_selector(node_fingerprint(A100)) == {"nvidia.com/cuda.driver-version.full": "550.54.15"}
    jet = node_fingerprint(default_fleet().pool("jetson-orin").node_labels("n"))
    assert pinning_selector(jet) == {"fleettune.dev/cuda.driver-version.full": "540.4.0",
                                     "fleettune.dev/jetson.l4t-version": "36.4.0"}
    assert pinning_selector(GpuFingerprint()) == {}


def _matches(expressions: list[dict], labels: dict[str, str]) -> bool:
    # The scheduler's semantics of In/NotIn (NotIn also matches a missing key).
    for e in expressions:
        value = labels.get(e["key"])
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
        if e["operator"] == "In" and value not in e["values"]:
            return False
    return True


@pytest.mark.parametrize("allow_shared", [False, True])
def test_eligibility_affinity_agrees_with_node_eligible(allow_shared: bool) -> None:
    from fleettune.fingerprint import UPGRADE_IN_PROGRESS, eligibility_affinity

    expressions = eligibility_affinity(allow_shared)
    cases = [A100, SLICED, A100 | {"nvidia.com/gpu.sharing-strategy": "mps"},
             A100 | {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}]
    cases += [A100 | {"nvidia.com/gpu-driver-upgrade-state": s} for s in UPGRADE_IN_PROGRESS]
    for labels in cases:
        assert _matches(expressions, labels) == node_eligible(labels, False, allow_shared)[0], labels


def test_the_status_form_has_the_models_fields() -> None:
    # TunedFor is GpuFingerprint's serialisation in the CRD: a field added to one needs the other.
    assert set(TunedFor.model_fields) == set(GpuFingerprint.model_fields)
