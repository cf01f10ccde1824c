"""kopf wiring: one tuning daemon per TuningRun, woken by the events of its Jobs, its trial
Pods' ends, and nodes.

Only a daemon and raw event handlers are used: no change handlers, so kopf writes no
diff-base or progress annotations into users' objects (GitOps tools see no drift).

The event handlers are coroutines: they run on the event loop, where the daemons' wake-up
events live (an ``asyncio.Event`` set from kopf's handler threads would not wake the loop),
and they only note what changed. Job events also feed the Jobs cache the runs list from;
Pod events feed the ended trial Pods a run records from before their Jobs complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from fleettune import GROUP, PLURAL, VERSION, metrics
from fleettune.controller.kube import EndedPods, Kube, WatchCache
from fleettune.controller.tuner import RunLoop
from fleettune.fingerprint import relevant_labels
from fleettune.jobs import MANAGED_BY, RUN_LABEL, run_label
from fleettune.names import bounded

IDLE_WAKEUP_S = 5.0
FINISHED_WAKEUP_S = 300.0
FAILED_BACKOFF_MAX_S = 60.0  # consecutive failed steps wait 5, 10, 20 ... up to this

_wakers: dict[str, asyncio.Event] = {}
# (namespace, run label) -> uid of the runs being tuned: trial Pods carry the run's label
# value (jobs.run_label: the name, hashed when longer than a label value may be).
_run_uids: dict[tuple[str, str], str] = {}
_runs_seen: dict[str, tuple[Any, dict[str, str]]] = {}  # uid -> (generation, annotations) last woken for
# (namespace, ConfigMap) -> uids of the runs whose kernel source it holds; those runs re-read
# it when it changes (uids in _sources_changed), rather than minutes later.
_sources: dict[tuple[str, str], set[str]] = {}
_sources_changed: set[str] = set()
_kube: Kube | None = None
# Fed by job_event (whose filter is the managed-by label) and node_event below.
_jobs = WatchCache(required={MANAGED_BY: "fleettune"})
_nodes = WatchCache()
_ended = EndedPods()  # fed by pod_event
# Node label changes that matter (driver upgrades, cordons, new or lost nodes) bump the
# epoch; runs re-read the nodes only then (or when their copy is old).
_nodes_seen: dict[str, tuple[dict[str, str], bool]] = {}
_node_epoch = 0


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube(job_cache=_jobs, node_cache=_nodes, background_deletes=True, ended_pods=_ended)
    return _kube


def node_epoch() -> int:
    return _node_epoch


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # k8s Events only for what a user must see
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)


def _wake(uid: str | None) -> None:
    if uid and uid in _wakers:
        _wakers[uid].set()


@kopf.on.event("batch", "v1", "jobs", labels={MANAGED_BY: "fleettune"})
async def job_event(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    _jobs.observe(event.get("type"), event.get("object") or {})
    if event.get("type") == "DELETED":
        _ended.job_deleted(body.metadata.namespace or "", body.metadata.uid)
    for owner in body.metadata.get("ownerReferences") or []:
        _wake(owner.get("uid"))


@kopf.on.event("", "v1", "pods", labels={MANAGED_BY: "fleettune"})
async def pod_event(event: dict[str, Any], namespace: str, labels: kopf.Labels, **_: Any) -> None:
    if _ended.observe(event.get("type"), event.get("object") or {}):
        _wake(_run_uids.get((namespace, labels.get(RUN_LABEL, ""))))


@kopf.on.event("", "v1", "nodes")
async def node_event(name: str, event: dict[str, Any], body: kopf.Body, type: str | None, **_: Any) -> None:
    global _node_epoch
    _nodes.observe(type, event.get("object") or {})  # before the epoch moves: runs re-read from it
    seen = None if type == "DELETED" else (relevant_labels(body.metadata.labels or {}),
                                           bool(body.spec.get("unschedulable")))
    if _nodes_seen.get(name) == seen:
        return  # heartbeats, gfd.timestamp relabels, ...
    if seen is None:
        _nodes_seen.pop(name, None)
    else:
        _nodes_seen[name] = seen
    _node_epoch += 1
    for waker in _wakers.values():
        waker.set()


@kopf.on.event("", "v1", "configmaps")
async def configmap_event(name: str, namespace: str, type: str | None, **_: Any) -> None:
    for uid in _sources.get((namespace, name), ()):
        _sources_changed.add(uid)
        _wake(uid)


def _track_source(uid: str, key: tuple[str, str] | None) -> None:
    """Note which ConfigMap holds the run's kernel source now (None: none)."""
    for other, uids in list(_sources.items()):
        if other != key:
            uids.discard(uid)
            if not uids:
                del _sources[other]
    if key is not None:
        _sources.setdefault(key, set()).add(uid)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def run_event(uid: str, name: str, namespace: str, type: str | None, meta: kopf.Meta, **_: Any) -> None:
    if type == "DELETED":
        metrics.forget_run(namespace, name)
        _runs_seen.pop(uid, None)
        _wake(uid)
        return
    # The loop reads the spec (generation) and the re-tune annotation. Its own status
    # writes come back as events too: waking for those would only add idle steps.
    seen = (meta.get("generation"), dict(meta.annotations))
    if _runs_seen.get(uid) != seen:
        _runs_seen[uid] = seen
        _wake(uid)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def tune(body: kopf.Body, uid: str, name: str, namespace: str, stopped: kopf.DaemonStopped,
               logger: logging.Logger, **_: Any) -> None:
    wake = _wakers.setdefault(uid, asyncio.Event())
    key = (namespace, run_label(name))
    _run_uids[key] = uid
    loop = RunLoop(kube(), body, logger, node_epoch)
    failures = 0
    try:
        while not stopped:
            wake.clear()
            if uid in _sources_changed:
                _sources_changed.discard(uid)
                loop.source_changed()
            try:
                finished = await loop.step()
                source = loop.spec.kernel.source if loop.spec is not None else None
                _track_source(uid, (namespace, source.config_map) if source is not None else None)
                failures = 0
            except Exception as exc:  # keep tuning after API hiccups; report and retry
                failures += 1
                logger.exception("tuning step failed: %s", bounded(exc, 500))
                metrics.reconcile_error(body.metadata.namespace, body.metadata.name)
                # A step that keeps failing (a conflict, an apiserver refusing a write) backs
                # off, not woken by events: those would only repeat the failure.
                await stopped.wait(min(IDLE_WAKEUP_S * 2 ** (failures - 1), FAILED_BACKOFF_MAX_S))
                continue
            # A finished run still wakes for spec edits, retune requests and node changes.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=FINISHED_WAKEUP_S if finished else IDLE_WAKEUP_S)
    finally:
        _wakers.pop(uid, None)
        _runs_seen.pop(uid, None)
        _sources_changed.discard(uid)
        _track_source(uid, None)
        if _run_uids.get(key) == uid:
            del _run_uids[key]
