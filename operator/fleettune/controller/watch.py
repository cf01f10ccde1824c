"""What the operator's own watches saw, kept for the tuning loops (thread-safe, no API calls).

A :class:`WatchCache` holds Jobs or nodes fed by kopf's events: every run lists its Jobs
on every step and the nodes every few seconds, which at fleet scale is most of the
operator's API traffic and JSON parsing. The cache is kept honest by what the operator
does itself (the Jobs it creates and deletes are entered at once), by the watch, and by a
real list of each selector at least every ``resync_s`` seconds, which also replaces
whatever a broken watch missed. Anything it cannot answer exactly (a selector that is not
plain ``key=value`` terms, a watch that has not delivered anything yet) is a real list.

:class:`EndedPods` holds the trial Pods whose end already decides their Job, seen on the
operator's Pod watch: a run records those trials without waiting for the Job controller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from fleettune.labels import BATCH_LABEL
from fleettune.results import decisive_end
from fleettune_job.protocol import CONTAINER_NAME, Answer


def parse_selector(selector: str) -> dict[str, str] | None:
    """``k=v,k2==v2`` as a dict; None for anything else (set-based terms, ``!=``, existence)."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!" in term or "(" in term or " " in term:
            return None
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if not sep or not key or "=" in value:
            return None
        out[key] = value
    return out


def _rv(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def _newer(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether ``new`` is at least as recent as ``old`` (unknown versions: trust the newcomer)."""
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


class WatchCache:
    """Objects by namespace ("" when cluster-scoped) and name, as last seen on the watch, in a
    list, or as written by us.

    Thread-safe: fed from the event loop (watch events) and read from worker threads.
    Returned bodies are shared: callers must not modify them.
    """

    # How long an object deleted by us (or seen deleted) is kept out of the cache: events
    # already in flight for it must not bring it back.
    TOMBSTONE_S = 300.0

    def __init__(self, required: Mapping[str, str] | None = None, resync_s: float = 30.0,
                 gist: Callable[[dict[str, Any]], Hashable] | None = None) -> None:
        # Labels every object fed to the cache carries (the watch's filter): only selectors
        # that imply them can be answered from it.
        self.required = dict(required or {})
        self.resync_s = resync_s
        self.gist = gist  # what in an object its readers act on (`observe`'s answer)
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {}
        self._gone: dict[str, float] = {}  # uid -> when it was deleted
        self._listed: dict[tuple[str, str], float] = {}  # (namespace, selector) -> last real list
        self.events = 0  # watch events seen: until the first, the cache is not used

    # ---------------------------------------------------------------- feeding
    def observe(self, event_type: str | None, obj: Mapping[str, Any]) -> bool:
        """A watch event (``ADDED``/``MODIFIED``/``DELETED``, or None for kopf's initial listing).

        True when the event changed what readers act on: an object came or went, or its
        ``gist`` changed (without a gist, any change). Not for an object the cache already
        had in that gist (one written by us, a status update beside the point), nor for one
        we deleted (its last events)."""
        meta = obj.get("metadata") or {}
        ns, name, uid = meta.get("namespace") or "", meta.get("name"), meta.get("uid")
        if not name:
            return False
        with self._lock:
            self.events += 1
            objects = self._objects.get(ns, {})
            before = objects.get(name)
            if event_type == "DELETED":
                self._forget(ns, name, uid)
            else:
                self._put(ns, name, uid, obj)
            after = self._objects.get(ns, {}).get(name)
        if before is None or after is None or self.gist is None:
            return before is not after
        return self.gist(before) != self.gist(after)

    def created(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("name"):
            with self._lock:
                self._put(meta.get("namespace") or "", meta["name"], meta.get("uid"), obj)

    def deleted(self, namespace: str, name: str) -> str | None:
        """Out of the cache at once (we deleted it); returns its uid, if it was cached."""
        with self._lock:
            return self._forget(namespace, name, None)

    def undelete(self, namespace: str, uid: str | None) -> None:
        """A deletion of ours failed: let the next real list bring the object back."""
        with self._lock:
            if uid:
                self._gone.pop(uid, None)
            for key in [k for k in self._listed if k[0] == namespace]:
                del self._listed[key]

    def _put(self, ns: str, name: str, uid: str | None, obj: Mapping[str, Any]) -> None:
        if uid is not None and uid in self._gone:
            return
        objects = self._objects.setdefault(ns, {})
        old = objects.get(name)
        if old is not None and old.get("metadata", {}).get("uid") == uid and not _newer(obj, old):
            return
        objects[name] = dict(obj)

    def _forget(self, ns: str, name: str, uid: str | None) -> str | None:
        objects = self._objects.get(ns, {})
        old = objects.get(name)
        if old is not None and (uid is None or old.get("metadata", {}).get("uid") == uid):
            uid = uid or old.get("metadata", {}).get("uid")
            del objects[name]
        if uid:
            now = time.monotonic()
            self._gone[uid] = now
            if len(self._gone) > 4096:
                self._gone = {u: t for u, t in self._gone.items() if now - t < self.TOMBSTONE_S}
        return uid

    # ---------------------------------------------------------------- reading
    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(namespace, {}).get(name)

    def fresh(self, namespace: str, selector: str) -> bool:
        with self._lock:
            last = self._listed.get((namespace, selector))
            return self.events > 0 and last is not None and time.monotonic() - last < self.resync_s

    def select(self, namespace: str, selector: str) -> list[dict[str, Any]] | None:
        """The cached objects matching an equality selector; None when a real list is due."""
        wanted = parse_selector(selector)
        if (wanted is None or any(wanted.get(k) != v for k, v in self.required.items())
                or not self.fresh(namespace, selector)):
            return None
        with self._lock:
            items = list(self._objects.get(namespace, {}).values())
        return [o for o in items
                if all((o.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in wanted.items())]

    def listed(self, namespace: str, selector: str, items: list[dict[str, Any]], list_rv: str | None,
               started: float) -> None:
        """A real list's result: authoritative for the selector as of its resourceVersion."""
        wanted = parse_selector(selector)
        if wanted is None:
            return
        snapshot = int(list_rv) if list_rv and list_rv.isdigit() else None
        with self._lock:
            objects = self._objects.setdefault(namespace, {})
            names = set()
            for item in items:
                meta = item.get("metadata") or {}
                names.add(meta.get("name"))
                self._put(namespace, str(meta.get("name")), meta.get("uid"), item)
            for name, obj in list(objects.items()):
                labels = obj.get("metadata", {}).get("labels") or {}
                if name in names or any(labels.get(k) != v for k, v in wanted.items()):
                    continue
                rv = _rv(obj)
                # Missing from the list: gone, unless it changed after the list was taken.
                if snapshot is None or rv is None or rv <= snapshot:
                    del objects[name]
            self._listed[(namespace, selector)] = started


def answers_in_log(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod is a batch whose trial container runs: its log carries answers now."""
    if ((pod.get("metadata") or {}).get("labels") or {}).get(BATCH_LABEL) != "true":
        return False
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("name") == CONTAINER_NAME and "running" in (c.get("state") or {})
        for c in status.get("containerStatuses") or [])


def _remember(entries: dict[Any, Any], key: Hashable, value: Any, limit: int) -> None:
    """``entries[key] = value``, the oldest entry dropped past ``limit`` (dicts keep order)."""
    entries[key] = value
    if len(entries) > limit:
        del entries[next(iter(entries))]


def job_name_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the Job a Pod belongs to (the Job controller's label)."""
    name = ((pod.get("metadata") or {}).get("labels") or {}).get("batch.kubernetes.io/job-name")
    return str(name) if name else None


def owning_job_uid(pod: Mapping[str, Any]) -> str | None:
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Job" and owner.get("uid"):
            return str(owner["uid"])
    return None


class EndedPods:
    """Trial Pods whose end decides their Job's verdict (`results.decisive_end`), by namespace
    and the uid of the Job that owns them, as seen on the operator's Pod watch.

    The Job controller marks a Job Complete seconds after its Pod ended (it batches Pod
    updates and needs two syncs); a run that reads the verdict from the Pod here records the
    trial and starts the next one at once. A trial Pod that is deleted ends with the answers
    it wrote and is then removed: kept here, those answers are read after the Pod is gone
    (a disrupted one is not decisive: its Job starts another Pod). An ended Pod never comes back to life, so an entry
    cannot turn wrong; keyed by the Job's uid, it cannot be mistaken for a re-created Job of
    the same name. Entries leave with their Job (its watch event), never with their Pod;
    events for Pods of a Job already deleted are ignored (the garbage collector deletes the
    Pods after the Job), and the size bound only guards against deletions a broken watch
    never delivered.

    Thread-safe: fed from the event loop, read from worker threads.

    ``key=job_name_of``: the Pods of MultiKueue worker clusters, by Job *name* (docs/operations/multikueue.md).
    A worker's copy of a trial Job has the manager's Job's name, not its uid, and Kueue
    deletes that copy, Pods included, 0.05–0.1 s after it mirrored the Job's end onto the
    manager's Job (measured): a run reading the Pods only then would find none, so the
    operator watches the workers' trial Pods into one of these. Names are not reused: a
    trial index is never measured twice.
    """

    MAX_ENTRIES = 20_000

    def __init__(self, key: Callable[[Mapping[str, Any]], str | None] | None = None) -> None:
        self._key = key or owning_job_uid
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._gone: dict[tuple[str, str], None] = {}  # deleted Jobs, oldest first (an ordered set)

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> bool:
        """A Pod watch event; True when it newly shows a decisive end (worth waking the run).
        A DELETED event carries the Pod's last state: read like any other."""
        job_uid = self._key(pod)
        if job_uid is None:
            return False
        key = ((pod.get("metadata") or {}).get("namespace") or "", job_uid)
        with self._lock:
            body = dict(pod)
            if key in self._pods or key in self._gone or not decisive_end(body):
                return False
            _remember(self._pods, key, body, self.MAX_ENTRIES)
            return True

    def job_deleted(self, namespace: str, job_uid: str | None) -> None:
        if job_uid:
            with self._lock:
                self._pods.pop((namespace, job_uid), None)
                _remember(self._gone, (namespace, job_uid), None, self.MAX_ENTRIES)

    def get(self, namespace: str, job_uid: str | None) -> dict[str, Any] | None:
        if not job_uid:
            return None
        with self._lock:
            return self._pods.get((namespace, job_uid))

    def __len__(self) -> int:
        return len(self._pods)



class StreamedAnswers:
    """The answers running batch Pods have printed so far (their ``fleettune-answer`` log
    lines), by namespace and the uid of the Job that owns the Pod, then entry index: what
    a run learns before the Pod ends and its termination message brings the same answers
    to the store.

    A Pod's log is read as it is written (`fleettune.controller.logfollow.LogFollowers`);
    an entry leaves with its Job (its watch event). The size bound only guards against
    deletions a broken watch never delivered. Thread-safe: fed from log-reading threads,
    read from worker threads.
    """

    MAX_JOBS = 20_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, str], dict[int, Answer]] = {}
        self._claimed: dict[str, None] = {}  # uids of the Pods whose log is read (or was), oldest first
        self._gone: dict[tuple[str, str], None] = {}  # deleted Jobs, oldest first
        self._ended: dict[tuple[str, str], None] = {}  # Jobs whose Pod ended: their logs say no more

    def claim(self, pod_uid: str, namespace: str, job_uid: str) -> bool:
        """True the first time a Pod of a Job not deleted is claimed: its log is read once."""
        with self._lock:
            if pod_uid in self._claimed or (namespace, job_uid) in self._gone:
                return False
            _remember(self._claimed, pod_uid, None, self.MAX_JOBS)
            return True

    def wanted(self, namespace: str, job_uid: str) -> bool:
        """Whether the Job's log is still worth reading (its Pod runs, the Job is not deleted)."""
        with self._lock:
            return (namespace, job_uid) not in self._gone and (namespace, job_uid) not in self._ended

    def pod_ended(self, namespace: str, job_uid: str | None) -> None:
        """The Job's Pod ended: stop reading its log (a kubelet closes it then; kwok does not),
        keep what it printed (until the Job's records are stored)."""
        if job_uid:
            with self._lock:
                _remember(self._ended, (namespace, job_uid), None, self.MAX_JOBS)

    def add(self, namespace: str, job_uid: str, answer: Answer) -> bool:
        """An answer printed by a Pod of the Job; True when it is new (the first for its index)."""
        key = (namespace, job_uid)
        with self._lock:
            if key in self._gone:
                return False
            answers = self._answers.get(key)
            if answers is None:
                answers = {}
                _remember(self._answers, key, answers, self.MAX_JOBS)
            if answer.i in answers:
                return False
            answers[answer.i] = answer
            return True

    def of(self, namespace: str, job_uid: str | None) -> dict[int, Answer]:
        with self._lock:
            return dict(self._answers.get((namespace, job_uid or ""), {}))

    def job_deleted(self, namespace: str, job_uid: str | None) -> None:
        if not job_uid:
            return
        with self._lock:
            self._answers.pop((namespace, job_uid), None)
            _remember(self._gone, (namespace, job_uid), None, self.MAX_JOBS)
