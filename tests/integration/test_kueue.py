"""TuningRuns whose trials go through the real Kueue (docs/operations/multikueue.md): the queue's quota, not
the run's parallelism, decides how many trials run; waiting is never failing; and a
higher-priority workload that preempts a batch of trials mid-way loses nothing and
records nothing as invalid."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kueue_support import queued_job
from operator_support import apply, example, get_run, stored_records, wait_for, wait_phase

from fleettune.labels import BATCH_LABEL, QUEUE_NAME_LABEL, QUEUE_PRIORITY_LABEL
from fleettune.results import job_finished
from fleettune_dev.cluster import LocalCluster
from fleettune_dev.cluster.kueue import KueueManager
from fleettune_dev.cluster.queues import Queues, apply_priority_class, apply_queues, delete_queues
from fleettune_job.protocol import Outcome

pytestmark = pytest.mark.integration

LOW, HIGH = "fleettune-tuning-low", "fleettune-production-high"


@pytest.fixture(scope="module", autouse=True)
def priorities(cluster: LocalCluster, kueue: KueueManager) -> None:
    apply_priority_class(cluster, LOW, 100, "tuning: preempted by production work")
    apply_priority_class(cluster, HIGH, 1000, "production")


@pytest.fixture
def queue(cluster: LocalCluster, kueue: KueueManager, namespace: str) -> Iterator[Queues]:
    """A LocalQueue whose ClusterQueue admits one A100 GPU at a time (the pool has more)."""
    q = apply_queues(cluster, namespace, pool="a100", gpus=1)
    yield q
    # While Kueue runs: it holds its objects with finalizers while Workloads use them.
    cluster.kubectl("delete", "jobs", "--all", "-n", namespace, "--wait=false", check=False)
    delete_queues(cluster, q)


class JobsSeen:
    """Polls the namespace's Jobs: the most admitted (running) and waiting at once, and
    every Job that Kueue suspended again after it had run (preempted)."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.most_admitted = self.most_waiting = 0
        self.jobs: dict[str, dict[str, Any]] = {}
        self.preempted: set[str] = set()
        self._admitted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> JobsSeen:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        while not self._stop.is_set():
            out = self.cluster.kubectl("get", "jobs", "-n", self.namespace, "-o", "json", check=False)
            if out.returncode == 0:
                jobs = [j for j in json.loads(out.stdout)["items"] if not job_finished(j)]
                trials = [j for j in jobs if "fleettune.dev/run" in j["metadata"].get("labels", {})]
                admitted = {j["metadata"]["name"] for j in trials if not j["spec"].get("suspend")}
                waiting = {j["metadata"]["name"] for j in trials if j["spec"].get("suspend")}
                self.preempted |= waiting & self._admitted
                self._admitted |= admitted
                self.most_admitted = max(self.most_admitted, len(admitted))
                self.most_waiting = max(self.most_waiting, len(waiting))
                self.jobs.update({j["metadata"]["name"]: j for j in trials})
            time.sleep(0.2)

    def admitted_batch_running(self, cluster: LocalCluster) -> str | None:
        """A batch Job that Kueue admitted and whose Pod runs now."""
        out = cluster.kubectl("get", "pods", "-n", self.namespace, "-l", f"{BATCH_LABEL}=true", "-o", "json")
        for pod in json.loads(out.stdout)["items"]:
            if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
                return str(pod["metadata"]["labels"]["batch.kubernetes.io/job-name"])
        return None


def _events(cluster: LocalCluster, namespace: str, reason: str) -> list[str]:
    """The run's own events of `reason` (Kueue posts some of the same reason on its Workloads)."""
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"reason={reason},involvedObject.kind=TuningRun", "-o", "json")
    return [e.get("message", "") for e in json.loads(out.stdout)["items"]]


def _queued_run(name: str, queue: dict[str, Any], **budget: Any) -> dict[str, Any]:
    doc = example(name, **budget)
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == "a100"]
    doc["spec"]["queue"] = queue
    return doc


def test_the_queues_quota_decides_how_many_trials_run_and_waiting_is_not_failing(
        cluster, namespace, simulator, operator, queue):
    doc = _queued_run("queued", {"name": queue.local_queue, "priorityClass": LOW}, trialsPerTarget=8,
                      parallelism=4, trialsPerPod=1)
    queued_seen = 0
    with JobsSeen(cluster, namespace) as seen:
        assert apply(cluster, namespace, doc).returncode == 0

        def finished() -> dict[str, Any] | None:
            nonlocal queued_seen
            run = get_run(cluster, namespace, "queued")
            targets = (run.get("status") or {}).get("targets") or []
            queued_seen = max([queued_seen, *(t.get("queued", 0) for t in targets)])
            return run if run.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        run = wait_for(finished, 300, "the queued run to finish", interval=0.3)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    # Kueue admitted one at a time (its quota: one GPU); the run kept no more waiting than admitted.
    assert seen.most_admitted == 1 and 1 <= seen.most_waiting <= 1, (seen.most_admitted, seen.most_waiting)
    assert queued_seen >= 1  # the status showed the waiting trial apart from the running one
    job = next(iter(seen.jobs.values()))
    assert job["metadata"]["labels"][QUEUE_NAME_LABEL] == queue.local_queue
    assert job["metadata"]["labels"][QUEUE_PRIORITY_LABEL] == LOW
    records = stored_records(cluster, namespace, "queued")
    assert len(records) == 8 and all(r.outcome != Outcome.INFRA_ERROR for r in records), [
        (r.index, r.outcome, r.error) for r in records]
    delayed = next(c for c in run["status"]["conditions"] if c["type"] == "QueueDelayed")
    assert delayed["status"] == "False"


def test_a_higher_priority_job_preempts_a_batch_mid_way_and_nothing_is_lost(
        cluster, api_client, namespace, simulator, operator, queue):
    from kubernetes import client

    doc = _queued_run("preempted", {"name": queue.local_queue, "priorityClass": LOW}, trialsPerTarget=17,
                      parallelism=1, trialsPerPod=16)
    doc["spec"]["strategy"] = {"name": "random", "seed": 5}  # no ramp: the second Pod takes all 16
    batch = client.BatchV1Api(api_client)
    # The batch must still be running when Kueue preempts it: at the session's pace its 16
    # configurations take about 2 s, which a loaded machine can spend before Kueue acts.
    normal = simulator.time_scale
    simulator.time_scale = 10 * normal
    with JobsSeen(cluster, namespace) as seen:
        try:
            assert apply(cluster, namespace, doc).returncode == 0
            victim = wait_for(lambda: seen.admitted_batch_running(cluster), 240, "a batch Pod running")
            batch.create_namespaced_job(namespace, queued_job("production", queue.local_queue, priority=HIGH))
            said = wait_for(lambda: _events(cluster, namespace, "Preempted"), 60,
                            "the operator to see the preemption")
        finally:
            simulator.time_scale = normal
        assert any(victim in m and "none counted as failed" in m for m in said), said
        print("\n" + "\n".join(said))
        # While production runs, the trials wait: nothing recorded as failed meanwhile.
        time.sleep(3)
        mid = stored_records(cluster, namespace, "preempted")
        assert all(r.outcome != Outcome.INFRA_ERROR for r in mid), [(r.index, r.error) for r in mid]
        assert get_run(cluster, namespace, "preempted")["status"]["phase"] == "Running"
        batch.delete_namespaced_job("production", namespace, propagation_policy="Background")
        run = wait_phase(cluster, namespace, "preempted", 300, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "preempted")
    # Every configuration measured once: none lost, none counted twice, none invalid for the preemption.
    assert len(records) == 17 and len({r.index for r in records}) == 17, [(r.index, r.outcome) for r in records]
    assert len({r.key for r in records}) == 17
    assert all(r.outcome != Outcome.INFRA_ERROR for r in records), [(r.index, r.error) for r in records]
    assert run["status"]["targets"][0]["infraFailed"] == 0


def test_the_charts_kueue_set_up_is_accepted_by_kueue_and_admits_a_run(cluster, namespace, simulator, operator):
    """The chart's optional Kueue objects (values `kueue.*`), applied to the real Kueue: its
    queues become Active, and a run that names the queue tunes through it."""
    from fleettune_dev.cluster.binaries import ensure_helm

    chart = Path(__file__).resolve().parents[2] / "charts" / "fleettune"
    sets = ["kueue.enabled=true", "kueue.queueName=chart-tuning", f"kueue.namespaces={{{namespace}}}",
            "kueue.flavors[0].name=chart-a100", "kueue.flavors[0].nodeLabels.fleettune\\.dev/pool=a100",
            "kueue.flavors[0].gpus=2", "kueue.priorityClass.name=chart-tuning-low", "kueue.priorityClass.value=50"]
    rendered = subprocess.run(
        [str(ensure_helm()), "template", "ft", str(chart), "-n", namespace, "--show-only", "templates/kueue.yaml",
         *(a for s in sets for a in ("--set", s))], capture_output=True, text=True, check=True).stdout
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    cluster.kubectl("wait", "--for=condition=Active", "clusterqueue/chart-tuning", "localqueue/chart-tuning",
                    "-n", namespace, "--timeout=60s", timeout=90)
    doc = _queued_run("charted", {"name": "chart-tuning", "priorityClass": "chart-tuning-low"}, trialsPerTarget=4,
                      parallelism=2)
    try:
        assert apply(cluster, namespace, doc).returncode == 0
        run = wait_phase(cluster, namespace, "charted", 240, operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert run["status"]["targets"][0]["completed"] == 4
    finally:
        cluster.kubectl("delete", "jobs", "--all", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "localqueue", "chart-tuning", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterqueue", "chart-tuning", "--wait=false", check=False)


def test_a_queue_that_admits_nothing_is_reported_and_nothing_fails(cluster, namespace, operator, kueue):
    """A LocalQueue that does not exist (a typo, or Kueue not set up for the namespace): the
    Jobs wait, suspended; past maxWaitSeconds the run says so, naming the queue; nothing is
    recorded, nothing counted as failed."""
    doc = _queued_run("typo", {"name": "gpu-tunning", "maxWaitSeconds": 10}, trialsPerTarget=4, parallelism=2)
    assert apply(cluster, namespace, doc).returncode == 0

    def delayed() -> dict[str, Any] | None:
        status = get_run(cluster, namespace, "typo").get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "QueueDelayed"), None)
        return status if cond and cond["status"] == "True" else None

    status = wait_for(delayed, 90, "QueueDelayed=True", interval=1.0)
    cond = next(c for c in status["conditions"] if c["type"] == "QueueDelayed")
    assert cond["reason"] == "QueueWaitExceeded" and "LocalQueue gpu-tunning" in cond["message"], cond
    target = status["targets"][0]
    # One Job waits, with the pool's first picks: the whole budget of 4.
    assert (target["queued"], target["podsQueued"], target["running"]) == (4, 1, 0), target
    assert status["phase"] == "Running" and target["infraFailed"] == 0
    assert not stored_records(cluster, namespace, "typo")
    jobs = json.loads(cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout)["items"]
    assert len(jobs) == 1 and jobs[0]["spec"]["suspend"] is True
    assert not json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    cluster.kubectl("delete", "tuningrun", "typo", "-n", namespace, "--wait=false")
