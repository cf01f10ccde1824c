"""Kueue's queue objects on a local control plane, applied with kubectl: a namespace's
ResourceFlavor, ClusterQueue and LocalQueue (`apply_queues`), WorkloadPriorityClasses, the
Workload of a Job, and the MultiKueue wiring of a manager cluster and its workers
(`apply_multikueue`; `fleettune_dev.cluster.kueue` runs the Kueue managers themselves and
describes how MultiKueue dispatches).
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster.fleet import GPU_RESOURCE
from fleettune_dev.cluster.kueue import API_GROUP, API_VERSION, MULTIKUEUE_CONTROLLER, NAMESPACE
from fleettune_dev.cluster.local import ClusterError, LocalCluster


@dataclass(frozen=True)
class Queues:
    """The names of what `apply_queues` made: a ResourceFlavor (cluster-scoped), a
    ClusterQueue and a LocalQueue in ``namespace`` (the Jobs' ``kueue.x-k8s.io/queue-name``)."""

    flavor: str
    cluster_queue: str
    local_queue: str
    namespace: str


def _queues(q: Queues, cpu: str, memory: str, gpus: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The ClusterQueue (a quota of ``q.flavor``, open to every namespace; ``extra``: more of
    its spec) and the LocalQueue of ``q``."""
    quota = [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": memory},
             {"name": GPU_RESOURCE, "nominalQuota": gpus}]
    return [
        {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": q.cluster_queue},
         "spec": {"namespaceSelector": {}, **extra, "resourceGroups": [{
             "coveredResources": ["cpu", "memory", GPU_RESOURCE],
             "flavors": [{"name": q.flavor, "resources": quota}]}]}},
        {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": q.local_queue, "namespace": q.namespace},
         "spec": {"clusterQueue": q.cluster_queue}},
    ]


def apply_queues(cluster: LocalCluster, namespace: str, *, name: str = "gpu", pool: str = "a100",
                 gpus: int = 1, cpu: str = "64", memory: str = "256Gi", flavor: str | None = None,
                 preemption: str = "LowerPriority", timeout: float = 60.0) -> Queues:
    """A ResourceFlavor selecting ``pool``'s nodes (`POOL_LABEL`; Kueue adds it to the
    admitted Pods' nodeSelector), a ClusterQueue ``<namespace>-<name>`` with a quota of
    ``gpus`` nvidia.com/gpu (and ``cpu``, ``memory``) of that flavor, open to every
    namespace, and a LocalQueue ``name`` in ``namespace`` pointing at it; waits until both
    queues are Active. ``preemption`` is the ClusterQueue's ``withinClusterQueue`` policy:
    ``LowerPriority`` (a higher-priority workload evicts lower ones), ``Never``, or
    ``LowerOrNewerEqualPriority``."""
    q = Queues(flavor=flavor or f"pool-{pool}", cluster_queue=f"{namespace}-{name}", local_queue=name,
               namespace=namespace)
    docs = [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": q.flavor},
         "spec": {"nodeLabels": {POOL_LABEL: pool}}},
        *_queues(q, cpu, memory, gpus, {"preemption": {"withinClusterQueue": preemption}}),
    ]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=fleettune-kueue", "-f", "-",
                    input=yaml.safe_dump_all(docs, sort_keys=False))
    for obj in (f"clusterqueue/{q.cluster_queue}", f"localqueue/{q.local_queue}"):
        cluster.kubectl("wait", "--for=condition=Active", obj, "-n", namespace, f"--timeout={int(timeout)}s",
                        timeout=timeout + 30)
    return q


def delete_queues(cluster: LocalCluster, q: Queues, *, flavor: bool = False) -> None:
    """Delete the LocalQueue and the ClusterQueue (and the ResourceFlavor, shared between
    queues of a pool, with ``flavor``). Kueue holds them with a finalizer while workloads
    use them: delete the Jobs first, and while the manager runs."""
    cluster.kubectl("delete", "localqueue", q.local_queue, "-n", q.namespace, "--ignore-not-found", "--wait=false")
    cluster.kubectl("delete", "clusterqueue", q.cluster_queue, "--ignore-not-found", "--wait=false")
    if flavor:
        cluster.kubectl("delete", "resourceflavor", q.flavor, "--ignore-not-found", "--wait=false")


def apply_priority_class(cluster: LocalCluster, name: str, value: int, description: str = "") -> None:
    """A WorkloadPriorityClass: a Job labelled ``kueue.x-k8s.io/priority-class: <name>``
    gets its priority in Kueue (queueing and preemption) without touching the Pods'."""
    doc = {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name},
           "value": value, "description": description}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=fleettune-kueue", "-f", "-",
                    input=yaml.safe_dump(doc))


def workload_of(cluster: LocalCluster, namespace: str, job_uid: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the Job with ``job_uid`` (owned by it), if any."""
    proc = cluster.kubectl("get", f"workloads.v1beta2.{API_GROUP}", "-n", namespace, "-o", "json",
                           f"-l={API_GROUP}/job-uid={job_uid}")
    items = json.loads(proc.stdout).get("items", [])
    if not items:
        with contextlib.suppress(ClusterError):
            proc = cluster.kubectl("get", f"workloads.v1beta2.{API_GROUP}", "-n", namespace, "-o", "json")
            items = [w for w in json.loads(proc.stdout).get("items", [])
                     if any(o.get("uid") == job_uid for o in w["metadata"].get("ownerReferences", []))]
    return items[0] if items else None


# --------------------------------------------------------------------- MultiKueue


@dataclass(frozen=True)
class MultiKueueQueues(Queues):
    """What `apply_multikueue` made. On the manager: ``flavor``, ``cluster_queue`` (with
    the AdmissionCheck ``admission_check``, parameters: the MultiKueueConfig ``config``
    listing the MultiKueueClusters ``clusters``) and ``local_queue``; on each worker
    ``worker_flavor`` (the pool's nodes) and a ClusterQueue and LocalQueue of the same
    names as the manager's."""

    admission_check: str = ""
    config: str = ""
    clusters: tuple[str, ...] = ()
    worker_flavor: str = ""


def apply_multikueue(manager: LocalCluster, workers: dict[str, LocalCluster], namespace: str, *,
                     name: str = "gpu", pool: str = "a100", gpus: int = 1, cpu: str = "64",
                     memory: str = "256Gi", worker_gpus: int | None = None, kubeconfig: str = "path",
                     timeout: float = 60.0) -> MultiKueueQueues:
    """MultiKueue from ``manager`` to ``workers`` (MultiKueueCluster name → cluster), each of
    which runs its own `KueueManager`, as does the manager.

    On each worker: ``namespace``, and `apply_queues` (a ResourceFlavor selecting ``pool``'s
    nodes, ClusterQueue ``<namespace>-<name>`` with ``worker_gpus`` (default ``gpus``), and
    LocalQueue ``name``). On the manager: a MultiKueueCluster per worker reading the
    worker's admin kubeconfig (``kubeconfig="path"``: from its file, which the manager, a
    host process, can read; ``"secret"``: copied into a Secret of Kueue's namespace), a
    MultiKueueConfig listing them, an AdmissionCheck of the MultiKueue controller with it,
    a ResourceFlavor ``multikueue-<pool>`` (no node labels: nothing runs on the manager), a
    ClusterQueue of the same name as the workers' with the admission check and a quota of
    ``gpus``, and the LocalQueue. Waits until the MultiKueueClusters, the AdmissionCheck and
    both queues are Active. A Job queued on the manager's LocalQueue then runs on a worker
    (a copy of the same name, the Pods there) and the manager's Job mirrors its status."""
    if kubeconfig not in ("path", "secret"):
        raise ValueError(f"kubeconfig must be 'path' or 'secret', not {kubeconfig!r}")
    cq = f"{namespace}-{name}"
    q = MultiKueueQueues(flavor=f"multikueue-{pool}", cluster_queue=cq, local_queue=name, namespace=namespace,
                         admission_check=cq, config=cq, clusters=tuple(workers), worker_flavor=f"pool-{pool}")
    for worker in workers.values():
        worker.kubectl("create", "namespace", namespace, check=False)
        apply_queues(worker, namespace, name=name, pool=pool, gpus=gpus if worker_gpus is None else worker_gpus,
                     cpu=cpu, memory=memory, flavor=q.worker_flavor, timeout=timeout)
    docs: list[dict[str, Any]] = []
    for cluster_name, worker in workers.items():
        if kubeconfig == "path":
            location = {"locationType": "Path", "location": str(worker.kubeconfig.resolve())}
        else:
            secret = f"multikueue-{cluster_name}"
            docs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                         "metadata": {"name": secret, "namespace": NAMESPACE},
                         "data": {"kubeconfig": base64.b64encode(worker.kubeconfig.read_bytes()).decode()}})
            location = {"locationType": "Secret", "location": secret}
        docs.append({"apiVersion": API_VERSION, "kind": "MultiKueueCluster", "metadata": {"name": cluster_name},
                     "spec": {"clusterSource": {"kubeConfig": location}}})
    docs += [
        {"apiVersion": API_VERSION, "kind": "MultiKueueConfig", "metadata": {"name": q.config},
         "spec": {"clusters": list(workers)}},
        {"apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": q.admission_check},
         "spec": {"controllerName": MULTIKUEUE_CONTROLLER,
                  "parameters": {"apiGroup": API_GROUP, "kind": "MultiKueueConfig", "name": q.config}}},
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": q.flavor}, "spec": {}},
        *_queues(q, cpu, memory, gpus, {"admissionChecksStrategy": {"admissionChecks": [{"name": q.admission_check}]}}),
    ]
    manager.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=fleettune-kueue", "-f", "-",
                    input=yaml.safe_dump_all(docs, sort_keys=False))
    waits = [*(f"multikueuecluster/{c}" for c in workers), f"admissioncheck/{q.admission_check}",
             f"clusterqueue/{q.cluster_queue}", f"localqueue/{q.local_queue}"]
    for obj in waits:
        proc = manager.kubectl("wait", "--for=condition=Active", obj, "-n", namespace, f"--timeout={int(timeout)}s",
                               timeout=timeout + 30, check=False)
        if proc.returncode != 0:
            got = manager.kubectl("get", obj, "-n", namespace, "-o", "jsonpath={.status.conditions}", check=False)
            raise ClusterError(f"{obj} not Active after {timeout:.0f}s: {got.stdout or got.stderr}")
    return q


def delete_multikueue(manager: LocalCluster, workers: dict[str, LocalCluster], q: MultiKueueQueues) -> None:
    """Delete what `apply_multikueue` made (the flavors stay): the queues on the manager and
    the workers, and the manager's AdmissionCheck, MultiKueueConfig and MultiKueueClusters
    (with their Secrets). Delete the Jobs first, while the managers run."""
    delete_queues(manager, q)
    for worker in workers.values():
        delete_queues(worker, q)
    manager.kubectl("delete", f"admissionchecks.v1beta2.{API_GROUP}", q.admission_check, "--ignore-not-found",
                    "--wait=false")
    manager.kubectl("delete", f"multikueueconfigs.v1beta2.{API_GROUP}", q.config, "--ignore-not-found",
                    "--wait=false")
    for c in q.clusters:
        manager.kubectl("delete", f"multikueueclusters.v1beta2.{API_GROUP}", c, "--ignore-not-found", "--wait=false")
        manager.kubectl("delete", "secret", f"multikueue-{c}", "-n", NAMESPACE, "--ignore-not-found")
