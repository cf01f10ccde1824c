"""The fleet's memory on the real control plane: a run starts from what earlier runs of the
same kernel measured — a run deleted with `fleetMemory.retainOnDelete` included — and a
namespace the operator lets share (`FLEETTUNE_SHARED_NAMESPACES`, the chart's
`fleetMemory.sharedNamespaces`) reads another's; the operator has only the chart's RBAC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from operator_support import (
    ChartIdentity,
    OperatorProcess,
    apply,
    example,
    stored_records,
    wait_for,
    wait_phase,
)

from fleettune import GROUP, PLURAL, VERSION
from fleettune.labels import RESULTS_OF_LABEL
from fleettune.names import label_value


@pytest.fixture
def more_namespaces(api_client: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """Two more namespaces: one that shares with the test's, one that does not."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    names = (f"{namespace[:50]}-b", f"{namespace[:50]}-c")
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {"fleettune.dev/test": "true"}}})
    yield names
    for name in names:
        core.delete_namespace(name)


@pytest.fixture
def sharing_operator(cluster: Any, crd: None, namespace: str, more_namespaces: tuple[str, str],
                     tmp_path: Any) -> Iterator[OperatorProcess]:
    """The operator watching the three namespaces, of which the first two share their runs' results."""
    shared, alone = more_namespaces
    identity = ChartIdentity(cluster, namespace, tmp_path, shared, alone)
    proc = OperatorProcess(identity.kubeconfig, namespace, tmp_path, also=(shared, alone),
                           env={"FLEETTUNE_SHARED_NAMESPACES": f"{namespace},{shared}"})
    proc.start()
    yield proc
    proc.stop()
    identity.remove()


def _one_target(name: str, target: int, **budget: int) -> dict[str, Any]:
    doc = example(name, **budget)
    doc["spec"]["targets"] = [doc["spec"]["targets"][target]]
    return doc


def _warm_start_events(cluster: Any, namespace: str, run: str) -> list[str]:
    out = cluster.kubectl("get", "events", "-n", namespace, "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"]
            if e.get("reason") == "WarmStart" and e["involvedObject"]["name"] == run]


def test_runs_start_from_live_and_retained_runs_of_the_kernel_in_their_namespace_and_a_shared_one(
        cluster, namespace, more_namespaces, simulator, sharing_operator):
    shared, alone = more_namespaces
    first = _one_target("first", 0, trialsPerTarget=6, parallelism=3)
    first["spec"]["fleetMemory"] = {"retainOnDelete": True}
    assert apply(cluster, namespace, first).returncode == 0
    assert apply(cluster, namespace, _one_target("gone", 0, trialsPerTarget=3, parallelism=3)).returncode == 0
    for name in ("first", "gone"):
        assert wait_phase(cluster, namespace, name, 240, sharing_operator)["status"]["phase"] == "Succeeded"
    kept = [r for r in stored_records(cluster, namespace, "first") if r.is_observation]
    assert len(kept) == 6 and len({r.kernel for r in kept}) == 1 and kept[0].kernel
    # Both deleted: the retained one's results stay, written with no owner for the garbage
    # collector to follow; the other's go with it (and are never read meanwhile).
    for name in ("first", "gone"):
        cluster.kubectl("delete", "-n", namespace, f"{PLURAL}.{VERSION}.{GROUP}", name, "--wait=true")
    shards = json.loads(cluster.kubectl("get", "configmaps", "-n", namespace, "-l",
                                        f"{RESULTS_OF_LABEL}={label_value('first')}", "-o", "json").stdout)["items"]
    assert shards and all(not cm["metadata"].get("ownerReferences") for cm in shards)

    # Another GPU's pool of the same kernel here, one in the namespace that shares with this
    # one, and one in a namespace that does not.
    assert apply(cluster, namespace, _one_target("second", 1, trialsPerTarget=4, parallelism=2)).returncode == 0
    assert apply(cluster, shared, _one_target("third", 0, trialsPerTarget=4, parallelism=2)).returncode == 0
    assert apply(cluster, alone, _one_target("fourth", 0, trialsPerTarget=4, parallelism=2)).returncode == 0
    for ns, name, learned in ((namespace, "second", "first"), (shared, "third", f"{namespace}/first")):
        run = wait_phase(cluster, ns, name, 240, sharing_operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        target = run["status"]["targets"][0]
        sources = {s["name"]: s["results"] for s in target["learnedFrom"] if s["kind"] == "Run"}
        # The first run's six results, those that are valid configurations of the pool's space.
        assert 0 < sources[learned] <= 6 and not any(s.endswith("gone") for s in sources), target
        assert 0 <= target["priorWeight"] <= 1
        said = wait_for(lambda ns=ns, name=name: _warm_start_events(cluster, ns, name), 30, "the WarmStart event")
        assert any(f"run {learned} (" in m for m in said), said
    assert {r.kernel for r in stored_records(cluster, shared, "third")} == {kept[0].kernel}
    # The namespace that does not share starts cold: one tenant never reads another's results.
    fourth = wait_phase(cluster, alone, "fourth", 240, sharing_operator)["status"]
    assert fourth["phase"] == "Succeeded" and not fourth["targets"][0].get("learnedFrom"), fourth
    assert not _warm_start_events(cluster, alone, "fourth")
