"""Blocking Kubernetes API calls the tuning loop needs, returning plain dicts.

Calls are made from worker threads (never on kopf's event loop). Lists are read raw
(`_preload_content=False`) to skip the client's slow model deserialisation.

Jobs and nodes can be served from a :class:`WatchCache` fed by the operator's own watches
(kopf's Job and node events): every run lists its Jobs on every step and the nodes every
few seconds, which at fleet scale is most of the operator's API traffic and JSON parsing.
The cache is kept honest by what the operator does itself (the Jobs it creates and deletes
are entered at once), by the watch, and by a real list of each selector at least every
``resync_s`` seconds, which also replaces whatever a broken watch missed. Anything it
cannot answer exactly (a selector that is not plain ``key=value`` terms, a watch that has
not delivered anything yet) is a real list.

With ``background_deletes``, ``delete_job`` hands the deletion to a few background threads
and returns at once (the Job is already out of the cache): a run reacts to a finished trial
without waiting for the apiserver to delete the trials before it. A deletion that fails is
logged and the Job put back on the next list, where the run finds it and deletes it again.
Only a few deletions may wait at a time: past that, ``delete_job`` deletes in the caller's
thread, so that a slow apiserver slows the runs down instead of piling up finished Jobs.

:class:`EndedPods` holds the trial Pods whose end already decides their Job, seen on the
operator's Pod watch: a run records those trials without waiting for the Job controller.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from fleettune import GROUP, PLURAL, VERSION
from fleettune.names import bounded
from fleettune.results import decisive_end

log = logging.getLogger(__name__)

# Connections kept per apiserver: as many as the threads that may call at once (the
# operator's 32 workers and Kube's 8 deleters), so that concurrent steps do not open (and
# TLS-handshake) throw-away connections.
POOL_CONNECTIONS = 40


def load_api_client() -> client.ApiClient:
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, POOL_CONNECTIONS)
    return client.ApiClient(cfg)


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

    def __init__(self, required: Mapping[str, str] | None = None, resync_s: float = 30.0) -> None:
        # Labels every object fed to the cache carries (the watch's filter): only selectors
        # that imply them can be answered from it.
        self.required = dict(required or {})
        self.resync_s = resync_s
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {}
        self._gone: dict[str, float] = {}  # uid -> when it was deleted
        self._listed: dict[tuple[str, str], float] = {}  # (namespace, selector) -> last real list
        self.events = 0  # watch events seen: until the first, the cache is not used
        self.hits = 0
        self.lists = 0

    # ---------------------------------------------------------------- feeding
    def observe(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event (``ADDED``/``MODIFIED``/``DELETED``, or None for kopf's initial listing)."""
        meta = obj.get("metadata") or {}
        ns, name, uid = meta.get("namespace") or "", meta.get("name"), meta.get("uid")
        if not name:
            return
        with self._lock:
            self.events += 1
            if event_type == "DELETED":
                self._forget(ns, name, uid)
                return
            self._put(ns, name, uid, obj)

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
            self.hits += 1
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
            self.lists += 1
            objects = self._objects.setdefault(namespace, {})
            names = set()
            for item in items:
                meta = item.get("metadata") or {}
                names.add(meta.get("name"))
                self._put(namespace, meta.get("name"), meta.get("uid"), item)
            for name, obj in list(objects.items()):
                labels = obj.get("metadata", {}).get("labels") or {}
                if name in names or any(labels.get(k) != v for k, v in wanted.items()):
                    continue
                rv = _rv(obj)
                # Missing from the list: gone, unless it changed after the list was taken.
                if snapshot is None or rv is None or rv <= snapshot:
                    del objects[name]
            self._listed[(namespace, selector)] = started


def _cached_list(cache: WatchCache | None, namespace: str, selector: str,
                 call: Callable[[], Any]) -> list[dict[str, Any]]:
    """``selector``'s objects from ``cache`` when it is fresh, else from ``call`` (a raw list
    request), whose answer then refreshes the cache."""
    if cache is not None:
        cached = cache.select(namespace, selector)
        if cached is not None:
            return cached
    started = time.monotonic()
    raw = json.loads(call().data)
    items = raw["items"]
    if cache is not None:
        cache.listed(namespace, selector, items, (raw.get("metadata") or {}).get("resourceVersion"), started)
    return items


def _owning_job_uid(pod: Mapping[str, Any]) -> str | None:
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Job" and owner.get("uid"):
            return str(owner["uid"])
    return None


class EndedPods:
    """Trial Pods whose end decides their Job's verdict (`results.decisive_end`), by namespace
    and the uid of the Job that owns them, as seen on the operator's Pod watch.

    The Job controller marks a Job Complete seconds after its Pod ended (it batches Pod
    updates and needs two syncs); a run that reads the verdict from the Pod here records the
    trial and starts the next one at once. An ended Pod never comes back to life, so an
    entry cannot turn wrong; keyed by the Job's uid, it cannot be mistaken for a re-created
    Job of the same name. Entries leave with their Pod or Job (watch events); the size bound
    only guards against deletions a broken watch never delivered.

    Thread-safe: fed from the event loop, read from worker threads.
    """

    MAX_ENTRIES = 20_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> bool:
        """A Pod watch event; True when it newly shows a decisive end (worth waking the run)."""
        job_uid = _owning_job_uid(pod)
        if job_uid is None:
            return False
        key = ((pod.get("metadata") or {}).get("namespace") or "", job_uid)
        with self._lock:
            if event_type == "DELETED":
                self._pods.pop(key, None)
                return False
            body = dict(pod)
            if key in self._pods or not decisive_end(body):
                return False
            if len(self._pods) >= self.MAX_ENTRIES:
                del self._pods[next(iter(self._pods))]
            self._pods[key] = body
            return True

    def job_deleted(self, namespace: str, job_uid: str | None) -> None:
        if job_uid:
            with self._lock:
                self._pods.pop((namespace, job_uid), None)

    def get(self, namespace: str, job_uid: str | None) -> dict[str, Any] | None:
        if not job_uid:
            return None
        with self._lock:
            return self._pods.get((namespace, job_uid))

    def __len__(self) -> int:
        return len(self._pods)


class Kube:
    DELETERS = 8  # background deletion threads

    def __init__(self, api: client.ApiClient | None = None, job_cache: WatchCache | None = None,
                 node_cache: WatchCache | None = None, background_deletes: bool = False,
                 ended_pods: EndedPods | None = None) -> None:
        self.api = api or load_api_client()
        self.job_cache = job_cache
        self.node_cache = node_cache
        self.ended_pods = ended_pods
        self._deleter = (ThreadPoolExecutor(max_workers=self.DELETERS, thread_name_prefix="fleettune-delete")
                         if background_deletes and job_cache is not None else None)
        self._deleting = threading.BoundedSemaphore(2 * self.DELETERS)

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @cached_property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @staticmethod
    def _items(resp: Any) -> list[dict[str, Any]]:
        return json.loads(resp.data)["items"]

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The Jobs matching ``selector``: from the watch-fed cache when it is fresh, else a real list.

        The bodies may be shared with the cache: do not modify them.
        """
        return _cached_list(self.job_cache, namespace, selector, lambda: self.batch.list_namespaced_job(
            namespace, label_selector=selector, _preload_content=False))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching ``selector``.

        For the Pods of one Job we have cached (``batch.kubernetes.io/job-name=NAME``), the
        list need only be as new as that Job: the Job controller wrote the Job's status after
        it saw those Pods' states. The apiserver then answers from its watch cache at once,
        instead of first waiting for the cache to catch up with etcd.
        """
        rv = self._job_rv(namespace, selector)
        if rv is not None:
            try:
                return self._items(self.core.list_namespaced_pod(
                    namespace, label_selector=selector, resource_version=rv,
                    resource_version_match="NotOlderThan", _preload_content=False))
            except ApiException as exc:
                if exc.status not in (410, 504):  # compacted / cache too far behind: a plain list
                    raise
        return self._items(
            self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        )

    def ended_pod(self, namespace: str, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Pod of ``job`` whose end decides it, if the Pod watch has shown one."""
        if self.ended_pods is None:
            return None
        return self.ended_pods.get(namespace, (job.get("metadata") or {}).get("uid"))

    def _job_rv(self, namespace: str, selector: str) -> str | None:
        cache = self.job_cache
        wanted = parse_selector(selector)
        if cache is None or wanted is None or set(wanted) != {"batch.kubernetes.io/job-name"}:
            return None
        job = cache.get(namespace, wanted["batch.kubernetes.io/job-name"])
        rv = (job or {}).get("metadata", {}).get("resourceVersion")
        return rv if isinstance(rv, str) and rv.isdigit() else None

    def list_nodes(self, selector: str) -> list[dict[str, Any]]:
        """The nodes matching ``selector``: from the watch-fed cache when it is fresh, else a real list.

        The bodies may be shared with the cache: do not modify them.
        """
        return _cached_list(self.node_cache, "", selector, lambda: self.core.list_node(
            label_selector=selector, _preload_content=False))

    def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a Job; False if it already exists (a restarted operator adopting its work)."""
        try:
            resp = self.batch.create_namespaced_job(namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        if self.job_cache is not None:
            self.job_cache.created(json.loads(resp.data))
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and its Pods (gone already is fine); in the background with ``background_deletes``."""
        if self._deleter is not None and self.job_cache is not None and self._deleting.acquire(blocking=False):
            uid = self.job_cache.deleted(namespace, name)
            try:
                self._deleter.submit(self._delete_in_background, namespace, name, uid)
            except RuntimeError:  # shut down: delete here
                self._deleting.release()
                self._delete_job(namespace, name)
            return
        self._delete_job(namespace, name)
        if self.job_cache is not None:
            self.job_cache.deleted(namespace, name)

    def _delete_job(self, namespace: str, name: str) -> None:
        try:
            # Read the (unparsed) answer: an unread response never gives its connection back
            # to the pool, and every later call would open (and TLS-handshake) a new one.
            _ = self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background",
                                                 _preload_content=False).data
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _delete_in_background(self, namespace: str, name: str, uid: str | None) -> None:
        try:
            self._delete_job(namespace, name)
        except Exception as exc:  # the next list shows the Job again, and its run deletes it again
            log.warning("deleting Job %s/%s failed, will retry: %s", namespace, name, str(exc)[:200])
            assert self.job_cache is not None
            self.job_cache.undelete(namespace, uid)
        finally:
            self._deleting.release()

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return self.core.read_namespaced_config_map(name, namespace).data or {}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The whole ConfigMap (metadata and data) as a dict, or None when there is none."""
        try:
            resp = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(resp.data)

    def write_config_map(self, namespace: str, body: dict[str, Any], resource_version: str | None) -> str:
        """Create (``resource_version`` None) or wholly replace the version read: one write, so
        readers never see half an update, and never over a change made since the read (the
        apiserver answers 409 and nothing is written). Returns the new resourceVersion."""
        if resource_version is None:
            resp = self.core.create_namespaced_config_map(namespace, body, _preload_content=False)
        else:
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
            resp = self.core.replace_namespaced_config_map(body["metadata"]["name"], namespace, body,
                                                           _preload_content=False)
        return json.loads(resp.data)["metadata"]["resourceVersion"]

    def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid): what
        `kubectl describe` and `kubectl events` show. Best effort: an event is never worth
        failing a step for."""
        when = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        namespace = involved["namespace"]
        body = {
            "metadata": {"generateName": f"{involved['name'][:200]}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type_,
            "reason": bounded(reason, 128),
            "message": bounded(message, 1024),
            "source": {"component": "fleettune-operator"},
            "reportingComponent": "fleettune.dev/operator",
            "reportingInstance": "fleettune-operator",
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(namespace, body, _preload_content=False)
        except Exception as exc:
            log.warning("posting event %s on %s failed: %s", reason, involved.get("name"), str(exc)[:200])

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )
