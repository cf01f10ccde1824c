"""MultiKueue between two local control planes: plain batch/v1 Jobs (no operator), then a
TuningRun whose pool is in the worker cluster (docs/operations/multikueue.md).

The manager is the session's cluster with its Kueue (the ``kueue`` fixture); the worker is a
second `LocalCluster` (the a100 pool only) with a Kueue of its own. A Job queued on the
manager's LocalQueue (its ClusterQueue has the MultiKueue AdmissionCheck) is copied to the
worker, runs there (its Pod on a worker node), and the manager's Job mirrors the worker
Job's status; no Pod is ever created on the manager. Each test prints what it saw, with
the seconds since it started (``pytest -s`` shows it): ``M`` is the manager, ``W`` the
worker.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kueue_support import Timeline, queued_job
from operator_support import ChartIdentity, OperatorProcess, apply, example, stored_records, wait_phase

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster import LocalCluster, default_fleet
from fleettune_dev.cluster.fleet import Fleet
from fleettune_dev.cluster.kueue import MULTIKUEUE_MANAGED_BY, MULTIKUEUE_ORIGIN_LABEL, KueueManager
from fleettune_dev.cluster.queues import MultiKueueQueues, apply_multikueue, delete_multikueue
from fleettune_dev.sim import FleetSimulator
from fleettune_job.protocol import Outcome

pytestmark = pytest.mark.integration

POOL = "a100"
WORKER = "worker-1"  # the MultiKueueCluster's name

ROOT = Path(__file__).resolve().parents[2]
READER = ROOT / "deploy" / "multikueue-worker.yaml"
TIME_SCALE = 0.3  # as the session's simulator (conftest.TEST_TIME_SCALE)


def _progress(msg: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"[fleettune worker cluster] {msg}\n")
    stream.flush()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, kueue: KueueManager) -> Iterator[LocalCluster]:
    """A second control plane with the a100 pool's nodes only, torn down at the end."""
    fleet = Fleet(pools=[default_fleet().pool(POOL)])
    c = LocalCluster(tmp_path_factory.mktemp("worker"), fleet, die_with_parent=True)
    with c.session(_progress):
        yield c


@pytest.fixture(scope="module")
def worker_kueue(worker: LocalCluster, kueue: KueueManager) -> Iterator[KueueManager]:
    manager = KueueManager(worker).start()
    _progress(f"worker kueue ready in {manager.startup_s:.1f}s (webhooks on :{manager.ports['webhook']})")
    yield manager
    # What the managers logged as errors during the module (the manager's cert-controller
    # logs a few "Webhook not found" at start-up).
    for m in (kueue, manager):
        errors = [_error_line(line) for line in m.log.read_text(errors="replace").splitlines()
                  if '"level":"error"' in line]
        print(f"\n{len(errors)} error line(s) in the kueue log of {m.cluster.state_dir.name}:\n"
              + "\n".join(f"  {n}x {e}" for e, n in Counter(errors).most_common(8)))
    manager.stop()


def _error_line(line: str) -> str:
    """A Kueue JSON log line's controller, message and error, without names and times."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line[:200]
    error = re.sub(r'"[^"]*"', '"…"', str(rec.get("error", "")))
    return f"{rec.get('controller', '')}: {rec.get('msg', '')}: {error[:200]}"


@pytest.fixture
def mk(cluster: LocalCluster, kueue: KueueManager, worker: LocalCluster, worker_kueue: KueueManager,
       namespace: str) -> Iterator[MultiKueueQueues]:
    t0 = time.monotonic()
    q = apply_multikueue(cluster, {WORKER: worker}, namespace, pool=POOL, gpus=1)
    print(f"\nMultiKueue set up (MultiKueueCluster and AdmissionCheck Active) in {time.monotonic() - t0:.2f}s")
    yield q
    # While both managers run: Kueue holds the queues with finalizers while Workloads use them.
    for c in (cluster, worker):
        client.BatchV1Api(c.api_client()).delete_collection_namespaced_job(namespace, propagation_policy="Background")
    delete_multikueue(cluster, {WORKER: worker}, q)
    if kueue.running() and worker_kueue.running():
        return
    print("manager kueue log:\n" + kueue.log_tail(40))
    print("worker kueue log:\n" + worker_kueue.log_tail(40))


def _complete_pod(core: client.CoreV1Api, pod: dict[str, Any], message: str, exit_code: int = 0) -> None:
    """What a kubelet reports of a container that exited (0: Succeeded, else Failed) with a
    termination message."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cond = {"status": "False", "reason": "PodCompleted" if exit_code == 0 else "PodFailed", "lastTransitionTime": now}
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "message": message,
                  "startedAt": now, "finishedAt": now}
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"terminated": terminated}} for c in pod["spec"]["containers"]]
    body = {"metadata": {"uid": pod["metadata"]["uid"]}, "status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [{"type": "Ready", **cond}, {"type": "ContainersReady", **cond}],
        "containerStatuses": statuses}}
    core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], body)


def _conds(obj: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c.get("reason", ""))
            for c in ((obj or {}).get("status") or {}).get("conditions") or []]


def _is_true(obj: dict[str, Any] | None, kind: str) -> bool:
    return any(c[0] == kind and c[1] == "True" for c in _conds(obj))


def _summary(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    st = obj.get("status") or {}
    if kind == "Job":
        return {"suspend": obj["spec"].get("suspend"), "managedBy": obj["spec"].get("managedBy"),
                "conditions": _conds(obj), "deleting": bool(obj["metadata"].get("deletionTimestamp")),
                **{k: st[k] for k in ("active", "ready", "terminating", "failed", "succeeded") if st.get(k)}}
    if kind == "Pod":
        return {"phase": st.get("phase"), "node": obj["spec"].get("nodeName"),
                "deleting": bool(obj["metadata"].get("deletionTimestamp"))}
    checks = [(c["name"], c["state"]) for c in st.get("admissionChecks") or []]
    return {"conditions": [c for c in _conds(obj) if c[1] == "True"], "admissionChecks": checks,
            "clusterName": st.get("clusterName"), "deleting": bool(obj["metadata"].get("deletionTimestamp"))}


def _logs(*managers: KueueManager, lines: int = 25) -> str:
    return "\n".join(f"--- kueue log of {m.cluster.state_dir.name}:\n{m.log_tail(lines)}" for m in managers)


def test_a_job_queued_on_the_manager_runs_on_the_worker_and_mirrors_its_status(
        cluster, kueue, worker, worker_kueue, namespace, mk):
    name = f"mk-{uuid.uuid4().hex[:5]}"
    batch = client.BatchV1Api(cluster.api_client())
    wcore = client.CoreV1Api(worker.api_client())
    print("\n(a)")
    with Timeline({"M": cluster, "W": worker}, namespace, _summary) as tl:
        t_create = tl.mark(f"creating {name} on the manager (spec.suspend=true)")
        created = json.loads(batch.create_namespaced_job(namespace, queued_job(name, mk.local_queue, suspend=True),
                                                         _preload_content=False).data)
        # Kueue's webhook set managedBy: the manager's Job controller never makes its Pods.
        assert created["spec"]["suspend"] is True
        assert created["spec"].get("managedBy") == MULTIKUEUE_MANAGED_BY, created["spec"]
        try:
            t_wjob = tl.until(lambda: tl.job(name, "W"), 60, "the Job on the worker")
            t_wrun = tl.until(lambda: tl.running_pod(name, "W"), 60, "the worker Pod Running")
            t_unsuspend = tl.until(lambda: (tl.job(name, "M") or {}).get("spec", {}).get("suspend") is False, 30,
                                   "the manager Job unsuspended")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(kueue, worker_kueue)}") from None
        wjob = tl.job(name, "W") or {}
        pod = tl.running_pod(name, "W") or {}
        assert pod["spec"]["nodeName"].startswith(f"{POOL}-")
        assert pod["spec"]["nodeSelector"][POOL_LABEL] == POOL
        assert wjob["metadata"]["labels"].get(MULTIKUEUE_ORIGIN_LABEL), wjob["metadata"]["labels"]
        assert wjob["spec"].get("managedBy") in (None, "kubernetes.io/job-controller")
        time.sleep(1)
        assert tl.pods(name, "M") == [], "a Pod was created on the manager"
        mjob = tl.job(name, "M") or {}
        print(f"(a) manager Job while running: spec.suspend={mjob['spec'].get('suspend')} "
              f"spec.managedBy={mjob['spec'].get('managedBy')} status={json.dumps(mjob.get('status'))}")
        print(f"(a) worker Job labels {wjob['metadata']['labels']}; worker Pod on {pod['spec']['nodeName']}, "
              f"nodeSelector {pod['spec']['nodeSelector']}")
        wls = {tag: [(w["metadata"]["name"], _summary("Workload", w)) for w in tl.workloads(tag)] for tag in "MW"}
        print(f"(a) Workloads: {json.dumps(wls)}")

        t_done = tl.mark(f"completing {name}'s worker Pod")
        _complete_pod(wcore, pod, message='{"result": "ok"}')
        try:
            t_complete = tl.until(lambda: _is_true(tl.job(name, "M"), "Complete"), 60, "the manager Job Complete")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(kueue, worker_kueue)}") from None
        time.sleep(5)  # what happens to the worker's copy once the manager's Job finished
        mjob = tl.job(name, "M") or {}
        print(f"(a) manager Job after completion: spec.suspend={mjob['spec'].get('suspend')} "
              f"spec.managedBy={mjob['spec'].get('managedBy')}\n    status={json.dumps(mjob.get('status'))}")
        print(f"(a) 5 s later: worker Job {'still there' if tl.job(name, 'W') else 'gone'}, "
              f"worker Pods {len(tl.pods(name, 'W'))}, manager Pods {len(tl.pods(name, 'M'))}")
        assert (mjob.get("status") or {}).get("succeeded") == 1
        assert tl.pods(name, "M") == []
        print(f"(a) manager create -> worker Job {t_wjob - t_create:.2f}s -> worker Pod Running "
              f"{t_wrun - t_create:.2f}s (manager Job unsuspended at {t_unsuspend - t_create:.2f}s); "
              f"worker Pod done -> manager Job Complete {t_complete - t_done:.2f}s")


def test_a_job_not_suspended_by_its_creator_is_dispatched_and_its_deletion_reaches_the_worker(
        cluster, kueue, worker, worker_kueue, namespace, mk):
    name = f"mk-{uuid.uuid4().hex[:5]}"
    batch = client.BatchV1Api(cluster.api_client())
    print("\n(b)")
    with Timeline({"M": cluster, "W": worker}, namespace, _summary) as tl:
        t_create = tl.mark(f"creating {name} on the manager (spec.suspend=false)")
        created = json.loads(batch.create_namespaced_job(namespace, queued_job(name, mk.local_queue, suspend=False),
                                                         _preload_content=False).data)
        print(f"(b) stored with spec.suspend={created['spec'].get('suspend')} "
              f"spec.managedBy={created['spec'].get('managedBy')}")
        assert created["spec"]["suspend"] is True  # Kueue's webhook suspended it
        assert created["spec"].get("managedBy") == MULTIKUEUE_MANAGED_BY
        try:
            t_run = tl.until(lambda: tl.running_pod(name, "W"), 60, "the worker Pod Running")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(kueue, worker_kueue)}") from None
        assert tl.pods(name, "M") == []
        print(f"(b) worker Pod Running {t_run - t_create:.2f}s after the creation")

        t_del = tl.mark(f"deleting {name} on the manager (propagation Background)")
        batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        try:
            t_mgone = tl.until(lambda: tl.job(name, "M") is None, 60, "the manager Job gone")
            t_wjob = tl.until(lambda: tl.job(name, "W") is None, 120, "the worker Job gone")
            t_wpods = tl.until(lambda: not tl.pods(name, "W"), 60, "the worker Pods gone")
            t_wwl = tl.until(lambda: not tl.workloads("W"), 60, "the worker Workload gone")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(kueue, worker_kueue)}") from None
        print(f"(b) after the manager Job's deletion: manager Job gone +{t_mgone - t_del:.2f}s, worker Job gone "
              f"+{t_wjob - t_del:.2f}s, worker Pods gone +{t_wpods - t_del:.2f}s, worker Workload gone "
              f"+{t_wwl - t_del:.2f}s")


def test_a_failed_worker_pod_fails_the_manager_job_with_a_secret_kubeconfig(
        cluster, kueue, worker, worker_kueue, namespace):
    """The MultiKueueCluster reads the worker's kubeconfig from a Secret of Kueue's namespace;
    the worker Pod exits 1 (backoffLimit 0): the manager's Job becomes Failed."""
    workers = {f"{WORKER}-secret": worker}
    q = apply_multikueue(cluster, workers, namespace, name="gpu-secret", pool=POOL, gpus=1, kubeconfig="secret")
    name = f"mk-{uuid.uuid4().hex[:5]}"
    batch = client.BatchV1Api(cluster.api_client())
    wcore = client.CoreV1Api(worker.api_client())
    print("\n(c)")
    try:
        with Timeline({"M": cluster, "W": worker}, namespace, _summary) as tl:
            t_create = tl.mark(f"creating {name} on the manager")
            batch.create_namespaced_job(namespace, queued_job(name, q.local_queue, suspend=True))
            try:
                t_run = tl.until(lambda: tl.running_pod(name, "W"), 60, "the worker Pod Running")
                pod = tl.running_pod(name, "W") or {}
                t_done = tl.mark(f"failing {name}'s worker Pod (exit 1)")
                _complete_pod(wcore, pod, message='{"error": "boom"}', exit_code=1)
                t_failed = tl.until(lambda: _is_true(tl.job(name, "M"), "Failed"), 60, "the manager Job Failed")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{_logs(kueue, worker_kueue)}") from None
            time.sleep(3)
            mjob = tl.job(name, "M") or {}
            print(f"(c) manager Job after the failure: spec.suspend={mjob['spec'].get('suspend')}\n"
                  f"    status={json.dumps(mjob.get('status'))}")
            print(f"(c) 3 s later: worker Job {'still there' if tl.job(name, 'W') else 'gone'}, "
                  f"manager Pods {len(tl.pods(name, 'M'))}")
            assert (mjob.get("status") or {}).get("failed") == 1
            assert tl.pods(name, "M") == []
            print(f"(c) worker Pod Running {t_run - t_create:.2f}s after the creation; worker Pod failed -> "
                  f"manager Job Failed {t_failed - t_done:.2f}s")
    finally:
        for c in (cluster, worker):
            client.BatchV1Api(c.api_client()).delete_collection_namespaced_job(namespace,
                                                                               propagation_policy="Background")
        delete_multikueue(cluster, workers, q)


def reader_kubeconfig(worker: LocalCluster, namespace: str, path: Path) -> Path:
    """deploy/multikueue-worker.yaml applied on the worker for ``namespace``, and a kubeconfig
    of its ServiceAccount: the operator reads the worker with no more than that."""
    docs = [d for d in yaml.safe_load_all(READER.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "RoleBinding":
            doc["metadata"]["namespace"] = namespace
    worker.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    token = worker.kubectl("create", "token", "fleettune-reader", "-n", "fleettune", "--duration=2h").stdout.strip()
    config = yaml.safe_load(Path(worker.kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_a_pool_in_a_worker_cluster_is_tuned_through_multikueue(
        cluster, crd, namespace, worker, mk, tmp_path):
    """The operator in the manager cluster, the pool's GPUs in the worker: the operator reads
    the dispatched trials' Pods and the pool's nodes there, with the read-only identity of
    deploy/multikueue-worker.yaml (Kueue deletes a worker's finished Pods within a second)."""
    workers = tmp_path / "workers"
    workers.mkdir()
    reader_kubeconfig(worker, namespace, workers / "edge")
    # Only the worker's Pods are answered: its fleet simulator; the manager has none running.
    sim = FleetSimulator(worker.kubeconfig, worker.fleet, time_scale=TIME_SCALE).start()
    identity = ChartIdentity(cluster, namespace, tmp_path)
    operator = OperatorProcess(identity.kubeconfig, namespace, tmp_path,
                               env={"FLEETTUNE_WORKER_KUBECONFIGS": str(workers)})
    operator.start()
    try:
        doc: dict[str, Any] = example("remote", trialsPerTarget=6, parallelism=2, trialsPerPod=2)
        # A pool the manager cluster has no node of: only the worker's nodes carry the label.
        doc["spec"]["targets"] = [{"name": "edge-a100", "nodeSelector": {"fleettune.dev/pool": "a100",
                                                                         "fleettune.dev/cluster": "edge"}}]
        doc["spec"]["queue"] = {"name": mk.local_queue}
        for node in worker.kubectl("get", "nodes", "-l", "fleettune.dev/pool=a100", "-o", "name").stdout.split():
            worker.kubectl("label", node, "fleettune.dev/cluster=edge", "--overwrite")
        assert apply(cluster, namespace, doc).returncode == 0
        run = wait_phase(cluster, namespace, "remote", 300, operator)
    finally:
        operator.stop()
        identity.remove()
        sim.stop()
        cluster.kubectl("delete", "jobs", "--all", "-n", namespace, "--wait=false", check=False)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    target = run["status"]["targets"][0]
    assert target["completed"] == 6 and target["infraFailed"] == 0, target
    records = stored_records(cluster, namespace, "remote")
    assert len(records) == 6 and all(r.outcome != Outcome.INFRA_ERROR for r in records), [
        (r.index, r.outcome, r.error) for r in records]
    # Measured on the worker's nodes, and the pool's fingerprint read from them.
    assert all(r.node and r.node.startswith("a100-") for r in records), [r.node for r in records]
    assert target["tunedFor"]["product"] == "NVIDIA-A100-PCIE-40GB"
    assert sim.answered, "the worker's simulator answered nothing"
