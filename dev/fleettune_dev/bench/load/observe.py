"""What `fleettune bench load` observes while the runs go: trial Pods and Jobs as watched
(`Observer`), what a Pod's termination message says, and the operator's and the
apiserver's own figures (/proc, the apiserver's metrics).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleettune.labels import RUN_LABEL, TARGET_LABEL, TRIAL_LABEL
from fleettune_dev.bench.load.workload import MANAGED, NAMESPACE
from fleettune_job.protocol import (
    CONTAINER_NAME,
    TRIAL_ENV,
    Batch,
    ProtocolError,
    decode_batch,
)


def revision(meta: dict[str, Any]) -> int | None:
    """An object's resourceVersion as a number: the local etcd's revision, one sequence for
    every kind, so it orders a Pod's end before the Job created on seeing it."""
    try:
        return int(meta.get("resourceVersion") or "")
    except ValueError:
        return None


@dataclass
class PodTimes:
    run: str
    target: str
    started: float | None = None
    finished: float | None = None
    created: float | None = None
    finished_rv: int | None = None  # resourceVersion of the update that ended it
    bound: float | None = None  # first seen with a node
    unschedulable: bool = False  # the scheduler found its pool full at least once
    gpu_busy_s: float | None = None  # GPU time its evaluations reported (None: no readable result)


@dataclass
class Observer:
    """Watches trial Pods and Jobs and records when each changed, in local wall-clock time."""

    api_factory: Any
    pods: dict[str, PodTimes] = field(default_factory=dict)
    # uid -> (run, target, created, resourceVersion when first seen: its creation's, seen ADDED)
    jobs: dict[str, tuple[str, str, float, int | None]] = field(default_factory=dict)
    jobs_done: dict[str, float] = field(default_factory=dict)  # uid -> when first seen Complete/Failed
    job_of_pod: dict[str, str] = field(default_factory=dict)  # pod uid -> job uid
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._watch, args=(kind,), daemon=True, name=f"bench-{kind}")
                   for kind in ("pods", "jobs")]
        for t in threads:
            t.start()
        return threads

    def _watch(self, kind: str) -> None:
        from kubernetes import client

        from fleettune_dev.sim.rawwatch import WatchExpired, raw_list, raw_watch

        api = self.api_factory()
        lister = (client.CoreV1Api(api).list_namespaced_pod if kind == "pods"
                  else client.BatchV1Api(api).list_namespaced_job)
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    items, rv = raw_list(lister, NAMESPACE, label_selector=MANAGED, _request_timeout=60)
                    for item in items:
                        self._seen(kind, item)
                for event, obj in raw_watch(lister, NAMESPACE, label_selector=MANAGED, resource_version=rv,
                                            timeout_seconds=5, allow_watch_bookmarks=True):
                    rv = obj["metadata"]["resourceVersion"]
                    if event in ("ADDED", "MODIFIED"):
                        self._seen(kind, obj)
                    if self.stop.is_set():
                        break
            except WatchExpired:
                rv = None
            except Exception as exc:  # keep watching through hiccups
                self.errors = [*self.errors[-20:], f"{kind}: {type(exc).__name__}: {exc}"]
                rv = None
                self.stop.wait(0.5)

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if kind == "jobs":
            self.jobs.setdefault(meta["uid"], (labels.get(RUN_LABEL, ""), labels.get(TARGET_LABEL, ""), now,
                                               revision(meta)))
            conditions = (obj.get("status") or {}).get("conditions") or []
            if meta["uid"] not in self.jobs_done and any(
                    c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
                self.jobs_done[meta["uid"]] = now
            return
        owner = next((o["uid"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
        if owner:
            self.job_of_pod.setdefault(meta["uid"], owner)
        times = self.pods.setdefault(meta["uid"], PodTimes(labels.get(RUN_LABEL, ""), labels.get(TARGET_LABEL, "")))
        if times.created is None:
            times.created = now
        if (obj.get("spec") or {}).get("nodeName") and times.bound is None:
            times.bound = now
        if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               for c in (obj.get("status") or {}).get("conditions") or []):
            times.unschedulable = True
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" and times.started is None:
            times.started = now
        if phase in ("Succeeded", "Failed") and times.finished is None:
            times.finished = now
            times.finished_rv = revision(meta)
            if times.started is None:
                times.started = now
            times.gpu_busy_s = gpu_busy_seconds(termination_message(obj))


def job_trials(job: dict[str, Any]) -> list[int]:
    """The trial indexes a Job holds (each entry's), from its work; its trial label when the
    work cannot be read."""
    for container in job["spec"]["template"]["spec"]["containers"]:
        for env in container.get("env") or []:
            if env.get("name") == TRIAL_ENV:
                try:
                    work = Batch.from_env(env.get("value") or "")
                except ValueError:
                    break
                return [e.index for e in work.entries]
    return [int(job["metadata"]["labels"][TRIAL_LABEL])]


def termination_message(pod: dict[str, Any]) -> str | None:
    """The trial container's termination message, once it has ended."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return ((status.get("state") or {}).get("terminated") or {}).get("message")
    return None


def gpu_busy_seconds(message: str | None) -> float | None:
    """GPU seconds a trial Pod's evaluations report (the sum of its answers'), None when the
    message is not a readable result."""
    try:
        return sum(a.r or 0.0 for a in decode_batch(message).answers)
    except ProtocolError:
        return None


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def apiserver_requests(api: Any) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = api.call_api("GET", f"{api.configuration.host}/metrics", _request_timeout=30)
    resp.read()
    text = resp.data.decode()
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if s.name == "apiserver_request_total":
                out[(s.labels.get("verb", ""), s.labels.get("resource", ""))] += s.value
    return out
