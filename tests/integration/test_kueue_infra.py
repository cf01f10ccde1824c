"""The real Kueue manager on the local control plane, with plain batch/v1 Jobs (no operator).

What Kueue does to a Job, seen from the Job and its Workload: the webhook suspends a queued
Job at creation and Kueue un-suspends it on admission (onto the ResourceFlavor's pool); a
Job beyond the quota waits suspended; a higher-priority Job evicts a running lower one,
which is suspended again (its Pods deleted) and waits to be re-admitted: not a failure.
Each test prints what it saw (``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kueue_support import Timeline, queued_job

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster import LocalCluster
from fleettune_dev.cluster.kueue import KueueManager
from fleettune_dev.cluster.queues import Queues, apply_priority_class, apply_queues, delete_queues, workload_of

pytestmark = pytest.mark.integration

POOL = "a100"
LOW, HIGH = "fleettune-test-low", "fleettune-test-high"


@pytest.fixture(scope="module", autouse=True)
def priorities(cluster: LocalCluster, kueue: KueueManager) -> None:
    apply_priority_class(cluster, LOW, 100)
    apply_priority_class(cluster, HIGH, 1000)


@pytest.fixture
def batch(api_client: Any) -> client.BatchV1Api:
    return client.BatchV1Api(api_client)


@pytest.fixture
def core(api_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def make_queues(cluster: LocalCluster, kueue: KueueManager, namespace: str,
                batch: client.BatchV1Api) -> Iterator[Callable[..., Queues]]:
    made: list[Queues] = []

    def make(**kwargs: Any) -> Queues:
        q = apply_queues(cluster, namespace, pool=POOL, **kwargs)
        made.append(q)
        return q

    yield make
    # While Kueue runs: it holds the queues with a finalizer while Workloads use them.
    batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
    for q in made:
        delete_queues(cluster, q)


def _pods(core: client.CoreV1Api, namespace: str, job: str) -> list[dict[str, Any]]:
    raw = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}", _preload_content=False).data
    return json.loads(raw)["items"]


def _conds(obj: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    return [(c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
            for c in ((obj or {}).get("status") or {}).get("conditions") or []]


def _cond(obj: dict[str, Any] | None, kind: str) -> tuple[str, str, str, str] | None:
    return next((c for c in _conds(obj) if c[0] == kind), None)


def _is_true(obj: dict[str, Any] | None, kind: str) -> bool:
    c = _cond(obj, kind)
    return c is not None and c[1] == "True"


def _complete_pod(core: client.CoreV1Api, pod: dict[str, Any]) -> None:
    """What a kubelet reports of a container that exited 0 (as the fleet simulator does)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cond = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                            "startedAt": now, "finishedAt": now}}}
                for c in pod["spec"]["containers"]]
    body = {"metadata": {"uid": pod["metadata"]["uid"]}, "status": {
        "phase": "Succeeded", "conditions": [{"type": "Ready", **cond}, {"type": "ContainersReady", **cond}],
        "containerStatuses": statuses}}
    core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], body)


def _running_pod(core: client.CoreV1Api, namespace: str, job: str) -> dict[str, Any] | None:
    return next((p for p in _pods(core, namespace, job)
                 if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")), None)


_QUIET_POD_CONDITIONS = ("PodScheduled", "Initialized", "PodReadyToStartContainers")


def _summary(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What the timeline prints of an object: the fields Kueue and the Job controller change."""
    st = obj.get("status") or {}
    conds = [(c["type"], c["status"], c.get("reason", "")) for c in st.get("conditions") or []]
    if kind == "Job":
        return {"suspend": obj["spec"].get("suspend"), "conditions": conds, "startTime": st.get("startTime"),
                **{k: st[k] for k in ("active", "ready", "terminating", "failed", "succeeded") if st.get(k)}}
    if kind == "Pod":
        ended = [(c["name"], c["state"]["terminated"].get("exitCode"), c["state"]["terminated"].get("reason"))
                 for c in st.get("containerStatuses") or [] if "terminated" in (c.get("state") or {})]
        return {"phase": st.get("phase"), "node": obj["spec"].get("nodeName"),
                "deleting": bool(obj["metadata"].get("deletionTimestamp")),
                "finalizers": obj["metadata"].get("finalizers") or [],
                "conditions": [c for c in conds if c[0] not in _QUIET_POD_CONDITIONS],
                "terminated": ended}
    return {"conditions": [(c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
                           for c in st.get("conditions") or []],
            "admission": (st.get("admission") or {}).get("clusterQueue")}


class Recorder(Timeline):
    """A Timeline of the one cluster, and whether a Job is admitted, or running."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        super().__init__({"": cluster}, namespace, _summary)

    def admitted(self, job: str) -> bool:
        j = self.job(job)
        return j is not None and j["spec"].get("suspend") is False and _is_true(self.workload(job), "Admitted")

    def running(self, job: str) -> bool:
        return self.running_pod(job) is not None


def test_a_queued_job_is_suspended_then_admitted_onto_the_pool(cluster, kueue, namespace, make_queues, batch,
                                                                core):
    q = make_queues(gpus=1)
    name = f"admit-{uuid.uuid4().hex[:5]}"
    print("\n(a)")
    with Recorder(cluster, namespace) as rec:
        rec.mark(f"creating {name}")
        created = json.loads(batch.create_namespaced_job(namespace, queued_job(name, q.local_queue),
                                                         _preload_content=False).data)
        # The mutating webhook suspended it before it was stored: no Pod could start early.
        assert created["spec"]["suspend"] is True
        t_admit = rec.until(lambda: rec.admitted(name), 60, "admission")
        t_run = rec.until(lambda: rec.running(name), 60, "a running Pod")
    pod = _pods(core, namespace, name)[0]
    # Kueue added the flavor's nodeLabels to the Pod's nodeSelector: it ran on the pool.
    assert pod["spec"]["nodeSelector"][POOL_LABEL] == POOL
    assert pod["spec"]["nodeName"].startswith(f"{POOL}-")
    wl = workload_of(cluster, namespace, created["metadata"]["uid"])
    assert wl is not None
    assert _is_true(wl, "QuotaReserved") and _is_true(wl, "Admitted")
    admission = wl["status"]["admission"]
    assert admission["clusterQueue"] == q.cluster_queue
    assert admission["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == q.flavor
    print(f"(a) created with spec.suspend=true; admitted (suspend=false) at {t_admit:.2f}s, Pod Running on "
          f"{pod['spec']['nodeName']} at {t_run:.2f}s; Pod nodeSelector {pod['spec']['nodeSelector']}")


def test_a_job_beyond_the_quota_waits_suspended(cluster, kueue, namespace, make_queues, batch, core):
    q = make_queues(gpus=1)
    first, second, third = (f"{n}-{uuid.uuid4().hex[:5]}" for n in ("first", "second", "third"))
    print("\n(b)")
    with Recorder(cluster, namespace) as rec:
        batch.create_namespaced_job(namespace, queued_job(first, q.local_queue))
        rec.until(lambda: rec.admitted(first) and rec.running(first), 60, "the first Job running")
        rec.mark(f"creating {second}")
        batch.create_namespaced_job(namespace, queued_job(second, q.local_queue))
        rec.until(lambda: _cond(rec.workload(second), "QuotaReserved"), 30, "the second Workload's QuotaReserved")
        time.sleep(5)  # it stays suspended while the first holds the only GPU
        job, wl = rec.job(second), rec.workload(second)
        assert job is not None and job["spec"]["suspend"] is True and rec.pods(second) == []
        reserved = _cond(wl, "QuotaReserved")
        assert reserved is not None and reserved[1:3] == ("False", "Pending")
        assert "insufficient unused quota for nvidia.com/gpu" in reserved[3], reserved
        print(f"(b) the second Workload waits: {reserved}")

        # The first Job completes: its quota goes back, the second is admitted.
        t_done = rec.mark(f"completing {first}'s Pod")
        _complete_pod(core, _running_pod(core, namespace, first) or {})
        t2 = rec.until(lambda: rec.admitted(second), 60, "the second Job's admission")
        assert _is_true(rec.job(first), "Complete")
        print(f"(b) second admitted {t2 - t_done:.2f}s after the first Job's Pod succeeded")

        # A third waits behind the second; deleting the second frees the GPU.
        batch.create_namespaced_job(namespace, queued_job(third, q.local_queue))
        rec.until(lambda: _cond(rec.workload(third), "QuotaReserved"), 30, "the third Workload pending")
        t_del = rec.mark(f"deleting {second}")
        batch.delete_namespaced_job(second, namespace, propagation_policy="Background")
        t3 = rec.until(lambda: rec.admitted(third), 60, "the third Job's admission")
        print(f"(b) third admitted {t3 - t_del:.2f}s after the second Job's deletion")


def test_a_higher_priority_job_preempts_a_running_lower_one(cluster, kueue, namespace, make_queues, batch, core):
    q = make_queues(gpus=1, preemption="LowerPriority")
    low, high = f"low-{uuid.uuid4().hex[:5]}", f"high-{uuid.uuid4().hex[:5]}"
    print("\n(c)")
    with Recorder(cluster, namespace) as rec:
        batch.create_namespaced_job(namespace, queued_job(low, q.local_queue, priority=LOW))
        rec.until(lambda: rec.admitted(low) and rec.running(low), 60, "the low-priority Job running")
        t_high = rec.mark(f"creating {high}")
        batch.create_namespaced_job(namespace, queued_job(high, q.local_queue, priority=HIGH))
        t_evicted = rec.until(lambda: _is_true(rec.workload(low), "Evicted"), 60, "the low Workload evicted")
        t_suspended = rec.until(lambda: (rec.job(low) or {}).get("spec", {}).get("suspend") is True, 60,
                                "the low Job suspended")
        t_gone = rec.until(lambda: not rec.pods(low), 60, "the low Job's Pods gone")
        t_admit = rec.until(lambda: rec.admitted(high), 60, "the high Job admitted")
        rec.until(lambda: rec.running(high), 60, "the high Job running")
        time.sleep(3)  # whatever else happens to the preempted Job
        job, wl = rec.job(low), rec.workload(low)
        assert job is not None and wl is not None
        print(f"(c) after the high Job's creation: low Workload Evicted at +{t_evicted - t_high:.2f}s, low Job "
              f"suspended at +{t_suspended - t_high:.2f}s, its Pods gone at +{t_gone - t_high:.2f}s, high "
              f"admitted at +{t_admit - t_high:.2f}s")
        print(f"(c) low Job now: spec.suspend={job['spec'].get('suspend')} status={json.dumps(job.get('status'))}")
        print(f"(c) low Workload now: {json.dumps(wl.get('status'), indent=1)}")
        assert job["spec"]["suspend"] is True and rec.pods(low) == []
        # Waiting, not failed: the Job has no Failed condition and counts no failed Pod.
        assert not _is_true(job, "Failed") and not (job.get("status") or {}).get("failed"), job.get("status")
        evicted, preempted = _cond(wl, "Evicted"), _cond(wl, "Preempted")
        assert evicted is not None and evicted[1:3] == ("True", "Preempted"), _conds(wl)
        assert preempted is not None and preempted[1:3] == ("True", "InClusterQueue"), _conds(wl)
        assert not _is_true(wl, "QuotaReserved") and not _is_true(wl, "Admitted")

        # The high Job completes: the low one is admitted again and gets a new Pod.
        t_done = rec.mark(f"completing {high}'s Pod")
        _complete_pod(core, _running_pod(core, namespace, high) or {})
        t_back = rec.until(lambda: rec.admitted(low) and rec.running(low), 60, "the low Job re-admitted")
        time.sleep(1)
        job = rec.job(low)
        print(f"(c) low re-admitted and running {t_back - t_done:.2f}s after the high Job's Pod succeeded; "
              f"low Job status {json.dumps((job or {}).get('status'))}")
        assert not _is_true(job, "Failed")
