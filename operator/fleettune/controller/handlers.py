"""kopf wiring: one tuning daemon per TuningRun, woken by the events of its Jobs, its trial
Pods' ends, nodes and the ConfigMaps holding kernel sources.

Only a daemon and raw event handlers are used: no change handlers, so kopf writes no
diff-base or progress annotations into users' objects (GitOps tools see no drift).

The operator's state (the watch caches, which run to wake for what, the metrics) is one
`OperatorState` in kopf's memo, set up at start-up: kopf hands each handler a shallow copy
of the memo, so they all share the one state object. The event handlers are coroutines:
they run on the event loop, where the daemons' wake-up events live (an ``asyncio.Event``
set from kopf's handler threads would not wake the loop), and they only note what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from fleettune import GROUP, PLURAL, VERSION
from fleettune.admission import TrialPolicy
from fleettune.controller.kube import Kube, load_workers
from fleettune.controller.logfollow import follow_answers_from_env
from fleettune.controller.observed import job_gist
from fleettune.controller.planner import DEFAULT_NODE_WAIT_S
from fleettune.controller.tuner import RunLoop
from fleettune.controller.watch import EndedPods, StreamedAnswers, WatchCache, answers_in_log, owning_job_uid
from fleettune.fingerprint import relevant_labels
from fleettune.jobs import run_label
from fleettune.labels import MANAGED_BY, MANAGER, RUN_LABEL
from fleettune.metrics import Metrics
from fleettune.names import bounded

IDLE_WAKEUP_S = 5.0
FINISHED_WAKEUP_S = 300.0
FAILED_BACKOFF_MAX_S = 60.0  # consecutive failed steps wait 5, 10, 20 ... up to this


NODE_WAIT_ENV = "FLEETTUNE_NODE_WAIT_SECONDS"


def node_wait_from_env() -> float:
    """How long a pool with no node waits, trials pending, for an autoscaler (0: not at all)."""
    raw = os.environ.get(NODE_WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_NODE_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{NODE_WAIT_ENV}={raw!r}: expected a number of seconds >= 0")
    return value


MODEL_THREADS_ENV = "FLEETTUNE_MODEL_THREADS"
# Torch's own default is a thread per core of the node, for fits of a few hundred points:
# where those threads outnumber the free cores they wait on each other (three processes of
# two threads on two cores fitted five times slower than of one thread each). Two threads
# halve a lone suggestion on the 17,956-configuration GEMM (142 -> 66 ms, the same CPU);
# each run plans in a thread of its own, so an operator with many runs fits side by side
# anyway, and one thread each is then the better setting (docs/decisions.md).
DEFAULT_MODEL_THREADS = 2


def model_threads_from_env() -> int:
    """Threads each model fit and suggestion computes on (torch's intra-op threads)."""
    raw = os.environ.get(MODEL_THREADS_ENV, "").strip()
    if not raw:
        return DEFAULT_MODEL_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{MODEL_THREADS_ENV}={raw!r}: expected a whole number of threads >= 1")
    return int(raw)


SHARED_NAMESPACES_ENV = "FLEETTUNE_SHARED_NAMESPACES"


def shared_namespaces_from_env() -> frozenset[str]:
    """The namespaces whose runs read each other's results (the fleet's memory); a run in
    any other namespace reads its own namespace's only."""
    return frozenset(n.strip() for n in os.environ.get(SHARED_NAMESPACES_ENV, "").split(",") if n.strip())


@dataclass
class OperatorState:
    metrics: Metrics = field(default_factory=Metrics.unregistered)
    node_wait_s: float = field(default_factory=node_wait_from_env)
    trial_policy: TrialPolicy = field(default_factory=TrialPolicy.from_env)  # a bad setting stops the start
    shared_namespaces: frozenset[str] = field(default_factory=shared_namespaces_from_env)
    # Fed by job_event (whose filter is the managed-by label), node_event and pod_event.
    jobs: WatchCache = field(default_factory=lambda: WatchCache(required={MANAGED_BY: MANAGER}, gist=job_gist))
    nodes: WatchCache = field(default_factory=WatchCache)
    ended: EndedPods = field(default_factory=EndedPods)
    streamed: StreamedAnswers = field(default_factory=StreamedAnswers)  # running batch Pods' answers
    # Running batch Pods whose logs are read at once for their answers (0: none).
    follow_answers: int = field(default_factory=follow_answers_from_env)
    wakers: dict[str, asyncio.Event] = field(default_factory=dict)  # run uid -> its loop's wake-up
    # (namespace, run label) -> uid of the runs being tuned: trial Pods carry the run's label
    # value (jobs.run_label: the name, hashed when longer than a label value may be).
    run_uids: dict[tuple[str, str], str] = field(default_factory=dict)
    runs_seen: dict[str, tuple[Any, dict[str, str]]] = field(default_factory=dict)  # uid -> (generation, annotations)
    # (namespace, ConfigMap) -> uids of the runs that read it (their kernel source, or a publish
    # target they were refused); those runs re-read it when it changes (uids in
    # configmaps_changed), rather than minutes later.
    configmaps: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    configmaps_changed: set[str] = field(default_factory=set)
    # Node label changes that matter (driver upgrades, cordons, new or lost nodes) bump the
    # epoch; runs re-read the nodes only then (or when their copy is old).
    nodes_seen: dict[str, tuple[dict[str, str], bool]] = field(default_factory=dict)
    node_epoch: int = 0
    _kube: Kube | None = None

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(job_cache=self.jobs, node_cache=self.nodes, background_deletes=True,
                              ended_pods=self.ended, workers=load_workers(), streamed=self.streamed,
                              follow_answers=self.follow_answers)
        return self._kube

    def wake(self, uid: str | None) -> None:
        if uid and uid in self.wakers:
            self.wakers[uid].set()

    def track_configmaps(self, uid: str, keys: set[tuple[str, str]]) -> None:
        """Note which ConfigMaps the run reads now."""
        for other, uids in list(self.configmaps.items()):
            if other not in keys:
                uids.discard(uid)
                if not uids:
                    del self.configmaps[other]
        for key in keys:
            self.configmaps.setdefault(key, set()).add(uid)


def state_of(memo: Any) -> OperatorState:
    state: OperatorState = memo.fleettune
    return state


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    import torch

    torch.set_num_threads(model_threads_from_env())  # a bad setting stops the start, naming it
    settings.posting.level = logging.WARNING  # k8s Events only for what a user must see
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    if getattr(memo, "fleettune", None) is None:  # `fleettune operator` passes one with its metrics
        memo.fleettune = OperatorState()


@kopf.on.event("batch", "v1", "jobs", labels={MANAGED_BY: MANAGER})
async def job_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    state = state_of(memo)
    # Only for what a step acts on: a Job's other updates (several per trial Pod) would each
    # cost its run a step, and a Pod that ends meanwhile would wait for it.
    changed = state.jobs.observe(event.get("type"), event.get("object") or {})
    if event.get("type") == "DELETED":
        state.ended.job_deleted(body.metadata.namespace or "", body.metadata.uid)
        state.streamed.job_deleted(body.metadata.namespace or "", body.metadata.uid)
    if changed:
        for owner in body.metadata.get("ownerReferences") or []:
            state.wake(owner.get("uid"))


@kopf.on.event("", "v1", "pods", labels={MANAGED_BY: MANAGER})
async def pod_event(event: kopf.RawEvent, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo,
                    **_: Any) -> None:
    state = state_of(memo)
    pod = event.get("object") or {}
    run = state.run_uids.get((namespace or "", labels.get(RUN_LABEL, "")))
    if state.ended.observe(event.get("type"), pod):
        state.streamed.pod_ended(namespace or "", owning_job_uid(pod))
        state.wake(run)
    elif run is not None and event.get("type") != "DELETED" and answers_in_log(pod):
        # Its answers as they are printed: the run learns each a Pod's length sooner.
        state.kube.follow_answers(pod, _waker(asyncio.get_running_loop(), state, run))


def _waker(loop: asyncio.AbstractEventLoop, state: OperatorState, uid: str) -> Callable[[], None]:
    """Wake run ``uid`` from another thread (a log reader's)."""
    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the operator is stopping
            loop.call_soon_threadsafe(state.wake, uid)
    return wake


@kopf.on.event("", "v1", "nodes")
async def node_event(name: str, event: kopf.RawEvent, body: kopf.Body, type: str | None, memo: kopf.Memo,
                     **_: Any) -> None:
    state = state_of(memo)
    state.nodes.observe(type, event.get("object") or {})  # before the epoch moves: runs re-read from it
    seen = None if type == "DELETED" else (relevant_labels(body.metadata.labels or {}),
                                           bool(body.spec.get("unschedulable")))
    if state.nodes_seen.get(name) == seen:
        return  # heartbeats, gfd.timestamp relabels, ...
    if seen is None:
        state.nodes_seen.pop(name, None)
    else:
        state.nodes_seen[name] = seen
    state.node_epoch += 1
    for waker in state.wakers.values():
        waker.set()


@kopf.on.event("", "v1", "configmaps")
async def configmap_event(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    state = state_of(memo)
    for uid in state.configmaps.get((namespace or "", name), ()):
        state.configmaps_changed.add(uid)
        state.wake(uid)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def run_event(uid: str, name: str, namespace: str | None, type: str | None, meta: kopf.Meta, memo: kopf.Memo,
                    **_: Any) -> None:
    state = state_of(memo)
    namespace = namespace or ""
    if type == "DELETED":
        state.metrics.forget_run(namespace, name)
        state.runs_seen.pop(uid, None)
        state.wake(uid)
        return
    # The loop reads the spec (generation) and the re-tune annotation. Its own status
    # writes come back as events too: waking for those would only add idle steps.
    seen = (meta.get("generation"), dict(meta.annotations))
    if state.runs_seen.get(uid) != seen:
        state.runs_seen[uid] = seen
        state.wake(uid)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def tune(body: kopf.Body, uid: str, name: str, namespace: str | None, stopped: kopf.DaemonStopped,
               logger: logging.Logger | logging.LoggerAdapter[Any], memo: kopf.Memo, **_: Any) -> None:
    state = state_of(memo)
    namespace = namespace or ""  # TuningRuns are namespaced
    wake = state.wakers.setdefault(uid, asyncio.Event())
    key = (namespace, run_label(name))
    state.run_uids[key] = uid
    loop = RunLoop(state.kube, body, logger, lambda: state.node_epoch, state.metrics, state.node_wait_s,
                   state.trial_policy, state.shared_namespaces)
    failures = 0
    try:
        while not stopped:
            wake.clear()
            if uid in state.configmaps_changed:
                state.configmaps_changed.discard(uid)
                loop.configmaps_changed()
            try:
                finished = await loop.step()
                state.track_configmaps(uid, {(namespace, name) for name in loop.configmaps_read()})
                failures = 0
            except Exception as exc:  # keep tuning after API hiccups; report and retry
                failures += 1
                logger.exception("tuning step failed: %s", bounded(exc, 500))
                state.metrics.reconcile_error(namespace, name)
                # A step that keeps failing (a conflict, an apiserver refusing a write) backs
                # off, not woken by events: those would only repeat the failure.
                await stopped.wait(min(IDLE_WAKEUP_S * 2 ** (failures - 1), FAILED_BACKOFF_MAX_S))
                continue
            # A finished run still wakes for spec edits, retune requests and node changes.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=FINISHED_WAKEUP_S if finished else IDLE_WAKEUP_S)
    finally:
        state.wakers.pop(uid, None)
        state.runs_seen.pop(uid, None)
        state.configmaps_changed.discard(uid)
        state.track_configmaps(uid, set())
        if state.run_uids.get(key) == uid:
            del state.run_uids[key]
