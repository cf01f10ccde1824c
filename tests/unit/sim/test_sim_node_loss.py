"""A Pod whose node is gone when its answer is due is never completed (no cluster: a fake API)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes.client import ApiException
from one_config import batch_env

from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.kubelet import Due
from fleettune_job.protocol import TRIAL_ENV, Trial

FLEET = default_fleet()


class FakeCore:
    def __init__(self, nodes: dict[str, str]) -> None:
        self.nodes = nodes
        self.patched: list[str] = []

    def read_node(self, name: str, **_: object) -> SimpleNamespace:
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name, "uid": self.nodes[name]}}))

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict, **_: object) -> SimpleNamespace:
        self.patched.append(name)
        return SimpleNamespace(data=b"{}")


def _due(sim: FleetSimulator, node_uid: str = "node-1") -> Due:
    trial = Trial(run="r", target="a100", index=0, kernel={"builtin": "convolution"}, config={},
                  problem_size=[4096, 4096])
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-1"},
           "spec": {"nodeName": "a100-0", "containers": [
               {"name": "trial", "image": "t", "env": [{"name": TRIAL_ENV, "value": batch_env(trial)}]}]}}
    answer = sim.answer(pod, FLEET.pool("a100").node_labels("a100-0"))
    sim._running.add("pod-1")
    due = Due(at=0.0, seq=0, namespace="ns", name="p", uid="pod-1", node="a100-0", node_uid=node_uid,
               answer=answer, trial=("ns", "r", "a100", -1), containers=[("trial", "t")], started={})
    sim._batches["pod-1"] = due  # running: its deletion would stop it
    return due


@pytest.mark.parametrize(("watched", "api", "completed"), [
    ({"a100-0": "node-1"}, {"a100-0": "node-1"}, True),  # the node is there
    (None, {"a100-0": "node-1"}, True),  # the node watch has not listed yet: the API says it is there
    ({"a100-0": "node-2"}, {"a100-0": "node-1"}, True),  # the watch is behind a re-created node
    ({}, {}, False),  # deleted
    ({"a100-0": "node-2"}, {"a100-0": "node-2"}, False),  # deleted and re-created under the same name
])
def test_a_pod_on_a_lost_node_is_never_completed(watched, api, completed):
    sim = FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0)
    core = FakeCore(api)
    due = _due(sim)
    sim._nodes = watched
    sim._complete(core, due)
    assert (core.patched == ["p"]) is completed
    assert sim.lost == (0 if completed else 1)
    assert bool(sim.answered) is completed
