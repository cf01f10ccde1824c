"""What the Kueue tests watch: each change of a namespace's Jobs, Pods and Workloads on one
or more clusters, printed with the seconds since the start (``pytest -s`` shows it), the
latest of each kept for the tests' conditions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, watch

from fleettune_dev.cluster import LocalCluster
from fleettune_dev.cluster.kueue import API_GROUP, PRIORITY_LABEL, QUEUE_LABEL

Summary = Callable[[str, dict[str, Any]], dict[str, Any]]  # (kind, object) -> what is printed of it


def owner_job(kind: str, obj: dict[str, Any]) -> str:
    """The Job a Pod or Workload belongs to (a worker's Workload, owned by nothing there at
    first, by its own name)."""
    if kind == "Pod":
        return (obj["metadata"].get("labels") or {}).get("job-name", "?")
    if kind == "Workload":
        owner = next((o["name"] for o in obj["metadata"].get("ownerReferences") or [] if o["kind"] == "Job"), None)
        return owner or obj["metadata"]["name"]
    return str(obj["metadata"]["name"])


class Timeline:
    """Watches ``namespace`` on each of ``clusters`` (tag -> cluster); ``summary`` says what
    of an object to print. Methods take the cluster's tag last (default: the first's)."""

    def __init__(self, clusters: Mapping[str, LocalCluster], namespace: str, summary: Summary) -> None:
        self.clusters, self.namespace, self.summary = dict(clusters), namespace, summary
        self.first = next(iter(self.clusters))
        self.t0 = time.monotonic()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.printed: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._watch, args=(tag, kind), daemon=True)
                        for tag in self.clusters for kind in ("Job", "Pod", "Workload")]

    def __enter__(self) -> Timeline:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=10)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, what: str) -> float:
        t = self.now()
        print(f"  t={t:6.2f}s -- {what}")
        return t

    def _watch(self, tag: str, kind: str) -> None:
        api = self.clusters[tag].api_client()
        try:
            if kind == "Job":
                fn, args = client.BatchV1Api(api).list_namespaced_job, (self.namespace,)
            elif kind == "Pod":
                fn, args = client.CoreV1Api(api).list_namespaced_pod, (self.namespace,)
            else:
                fn = client.CustomObjectsApi(api).list_namespaced_custom_object
                args = (API_GROUP, "v1beta2", self.namespace, "workloads")
            rv: str | None = None
            while not self.stopped.is_set():
                kwargs: dict[str, Any] = {"timeout_seconds": 1, "deserialize": False}
                if rv:
                    kwargs["resource_version"] = rv
                for ev in watch.Watch().stream(fn, *args, **kwargs):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    self._record(tag, kind, ev["type"], obj)
        finally:
            api.close()

    def _record(self, tag: str, kind: str, event: str, obj: dict[str, Any]) -> None:
        key = (tag, kind, obj["metadata"]["name"])
        summary = {"DELETED": True} if event == "DELETED" else self.summary(kind, obj)
        with self.lock:
            if event == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            before = self.printed.get(key)
            if summary == before:
                return
            self.printed[key] = summary
        changed = summary if before is None else {k: v for k, v in summary.items() if before.get(k) != v}
        label = f"{kind} {obj['metadata']['name']}" if kind == "Job" else f"{kind} of {owner_job(kind, obj)}"
        print(f"  t={self.now():6.2f}s {tag + ' ' if len(self.clusters) > 1 else ''}{label}: {json.dumps(changed)}")

    def _of(self, tag: str | None, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (t, k, _), o in self.objects.items() if t == (tag or self.first) and k == kind]

    def job(self, name: str, tag: str | None = None) -> dict[str, Any] | None:
        return next((o for o in self._of(tag, "Job") if o["metadata"]["name"] == name), None)

    def pods(self, job: str, tag: str | None = None) -> list[dict[str, Any]]:
        return [o for o in self._of(tag, "Pod") if owner_job("Pod", o) == job]

    def workloads(self, tag: str | None = None) -> list[dict[str, Any]]:
        return self._of(tag, "Workload")

    def workload(self, job: str, tag: str | None = None) -> dict[str, Any] | None:
        return next((o for o in self.workloads(tag) if owner_job("Workload", o) == job), None)

    def running_pod(self, job: str, tag: str | None = None) -> dict[str, Any] | None:
        return next((p for p in self.pods(job, tag)
                     if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")), None)

    def until(self, predicate: Callable[[], Any], timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return self.now()
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def queued_job(name: str, queue: str, *, gpus: int = 1, priority: str | None = None,
               suspend: bool | None = None) -> dict[str, Any]:
    """A plain Job shaped like fleettune's batch trials (backoffLimit 0, a deadline, GPUs,
    CPU and memory requested), labelled for ``queue`` (and ``priority``, a
    WorkloadPriorityClass); ``suspend``: as created (None: left to Kueue's webhook)."""
    labels = {QUEUE_LABEL: queue} | ({PRIORITY_LABEL: priority} if priority else {})
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 600,
        "template": {"spec": {
            "restartPolicy": "Never",
            "runtimeClassName": "nvidia",
            "containers": [{"name": "trial", "image": "example.invalid/trial:1", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"nvidia.com/gpu": str(gpus)}}}],
        }},
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels}, "spec": spec}
