"""The local control plane: fake GPU pools, real scheduling, garbage collection, clean shutdown."""

from __future__ import annotations

import sys
import uuid
from functools import partial
from pathlib import Path

import operator_support
import pytest
from kubernetes import client

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster import LocalCluster, default_fleet
from fleettune_dev.cluster.processes import find

pytestmark = pytest.mark.integration


# Services and Pods answer in well under a second here: poll faster than the operator tests do.
wait_for = partial(operator_support.wait_for, interval=0.2)


def _job(name: str, pool: str, gpus: int = 1, **pod_spec) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "runtimeClassName": "nvidia",
                "nodeSelector": {POOL_LABEL: pool},
                "containers": [{"name": "trial", "image": "example.invalid/trial:1",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                **pod_spec,
            }},
        },
    }


def _pods(core: client.CoreV1Api, namespace: str, job: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items


def test_every_pool_has_its_labelled_gpu_nodes(cluster, api_client):
    core = client.CoreV1Api(api_client)
    fleet = cluster.fleet
    for pool in fleet.pools:
        nodes = core.list_node(label_selector=f"{POOL_LABEL}={pool.name}").items
        assert sorted(n.metadata.name for n in nodes) == pool.node_names()
        for node in nodes:
            labels = node.metadata.labels
            assert labels == {**labels, **pool.node_labels(node.metadata.name)}
            assert labels["kubernetes.io/arch"] == pool.arch
            assert node.status.capacity["nvidia.com/gpu"] == str(pool.gpu.per_node)
            assert node.status.allocatable["nvidia.com/gpu"] == str(pool.gpu.per_node)
            assert {"cpu", "memory", "pods"} <= set(node.status.allocatable)
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    a100 = core.read_node("a100-0").metadata.labels
    assert a100["nvidia.com/gpu.product"] == "NVIDIA-A100-PCIE-40GB"
    jetson = core.read_node("jetson-orin-0")
    assert jetson.metadata.labels["fleettune.dev/gpu.product"] == "Jetson-AGX-Orin"
    assert "nvidia.com/gpu.product" not in jetson.metadata.labels
    assert [(t.key, t.value, t.effect) for t in jetson.spec.taints] == [("edge", "true", "NoSchedule")]


def test_runtime_class_nvidia_exists(cluster, api_client):
    rc = client.NodeV1Api(api_client).read_runtime_class("nvidia")
    assert rc.handler == "nvidia"


def test_scheduler_binds_gpu_jobs_to_the_selected_pool(cluster, api_client, namespace):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, _job("on-a4000", "rtx-a4000"))
    edge = _job("on-jetson", "jetson-orin",
                tolerations=[{"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}])
    batch.create_namespaced_job(namespace, edge)
    for job, pool in (("on-a4000", "rtx-a4000"), ("on-jetson", "jetson-orin")):
        pod = wait_for(lambda job=job: [p for p in _pods(core, namespace, job) if p.status.phase == "Running"],
                       60, f"a Running pod of {job}")[0]
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.labels[POOL_LABEL] == pool
    # The scheduler counts nvidia.com/gpu: an A100 node has 4, so 5 cannot fit anywhere.
    batch.create_namespaced_job(namespace, _job("too-big", "a100", gpus=5))

    def unschedulable():
        for p in _pods(core, namespace, "too-big"):
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return c.message
        return None

    assert "nvidia.com/gpu" in wait_for(unschedulable, 60, "the 5-GPU pod to be unschedulable")
    # Without the toleration the tainted Jetson nodes are off limits.
    batch.create_namespaced_job(namespace, _job("untolerated", "jetson-orin"))
    assert "untolerated taint" in wait_for(
        lambda: next((c.message for p in _pods(core, namespace, "untolerated")
                      for c in p.status.conditions or [] if c.reason == "Unschedulable"), None),
        60, "the untolerated pod to be unschedulable")


def test_deleting_a_job_cascades_to_its_running_pods(cluster, api_client, namespace):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, _job("doomed", "a100"))
    wait_for(lambda: [p for p in _pods(core, namespace, "doomed") if p.status.phase == "Running"], 60,
             "a Running pod")
    # Background propagation: the garbage collector deletes the pod, kwok's pod-delete stage
    # plays the kubelet and removes it.
    batch.delete_namespaced_job("doomed", namespace, propagation_policy="Background")
    wait_for(lambda: not _pods(core, namespace, "doomed"), 60, "the pod to be garbage-collected")


def test_owner_reference_cascade_from_a_custom_owner(cluster, api_client, namespace):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    job = _job("owned", "a100")
    job["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                           "uid": owner.metadata.uid, "blockOwnerDeletion": True}]
    batch.create_namespaced_job(namespace, job)
    wait_for(lambda: _pods(core, namespace, "owned"), 60, "the owned job's pod")
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Foreground")
    wait_for(lambda: not batch.list_namespaced_job(namespace).items, 60, "the job to be collected")
    wait_for(lambda: not _pods(core, namespace, "owned"), 60, "the pod to be collected")


def test_an_object_of_a_kind_installed_moments_ago_goes_with_its_owner(cluster, api_client, namespace):
    """As Kueue's Workloads go with their Jobs. kube-controller-manager's garbage collector
    learns of a new kind only at its discovery resync, every 30 s: `wait_established`
    restarts it when it is older than the CRD (an orphaned Workload left in its queue is what
    Kueue can re-admit as it is collected, and then it admits nothing else; docs/operations/multikueue.md)."""
    plural = f"gadgets{uuid.uuid4().hex[:8]}"
    group, kind = "test.fleettune.dev", f"Gadget{plural[7:]}"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"{plural}.{group}"},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"plural": plural, "singular": plural, "kind": kind},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    ext, core = client.ApiextensionsV1Api(api_client), client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    ext.create_custom_resource_definition(crd)
    try:
        cluster.wait_established(f"{plural}.{group}")
        owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "gadget-owner"}})
        custom.create_namespaced_custom_object(group, "v1", namespace, plural, {
            "apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "owned", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "gadget-owner", "uid": owner.metadata.uid}]}})
        core.delete_namespaced_config_map("gadget-owner", namespace, propagation_policy="Background")
        # Well under the resync's 30 s: without the restart, only a resync due by chance passes.
        wait_for(lambda: not custom.list_namespaced_custom_object(group, "v1", namespace, plural)["items"], 8,
                 "the owned object to be collected")
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")


def test_up_is_idempotent_restarts_keep_state_and_down_leaves_nothing(tmp_path: Path):
    state = tmp_path / f"c-{uuid.uuid4().hex[:6]}"
    fleet = default_fleet()
    c = LocalCluster(state, fleet, die_with_parent=True)
    try:
        c.up()
        pids = {n: info["pid"] for n, info in c.status()["components"].items()}
        assert all(pids.values())
        c.up()  # already up: nothing restarts
        assert {n: info["pid"] for n, info in c.status()["components"].items()} == pids
        c.kubectl("create", "configmap", "survivor", "--from-literal=a=b")
        c.restart_apiserver(with_etcd=True, crash=True)
        assert c.kubectl("get", "configmap", "survivor", "-o", "jsonpath={.data.a}").stdout == "b"
        st = c.status()
        assert all(info["running"] for info in st["components"].values())
        assert sorted(st["nodes"]) == sorted(fleet.pool_names())
        # What `fleettune demo --keep` leaves running with the cluster, and `down` must stop.
        sim, _ = c.start_service("simulator", [sys.executable, "-m", "fleettune.cli", "simulate",
                                               "--kubeconfig", str(c.kubeconfig), "--state-dir", str(state)])
        log = c.logs_dir / "simulator.log"
        wait_for(lambda: "simulating pools a100, rtx-a4000, jetson-orin" in log.read_text(), 60,
                 "the simulator to start")
        assert c.status()["services"]["simulator"]["pid"] == sim.pid
        # Its temporary files (the kubernetes client's copies of the kubeconfig's certificates,
        # the Pods' log folder) go in the state directory, which `down` removes.
        environ = Path(f"/proc/{sim.pid}/environ").read_bytes().split(b"\0")
        assert f"TMPDIR={state / 'tmp' / 'simulator'}".encode() in environ
        assert [p.name for p in (state / "tmp" / "simulator").iterdir() if p.name.startswith("fleettune-sim-logs-")]
    finally:
        c.down()
    assert not state.exists()
    assert not find(lambda argv: any(str(state) in a for a in argv)), "a component or service survived `down`"
    for pid in pids.values():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_status_command_reports_components_and_pools(cluster, capsys):
    from fleettune_dev.cluster.cli import main

    assert main(["status", "--state-dir", str(cluster.state_dir)]) == 0
    out = capsys.readouterr().out
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        assert f"{name} " in out and "running (pid" in out
    assert "pool a100               2 node(s), 2 Ready, 8 GPU(s), amd64" in out
    assert "pool jetson-orin        2 node(s), 2 Ready, 2 GPU(s), arm64" in out
