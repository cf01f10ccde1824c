"""Blocking Kubernetes API calls the tuning loop needs, returning plain dicts.

Calls are made from worker threads (never on kopf's event loop). Lists are read raw
(`_preload_content=False`) to skip the client's slow model deserialisation.

Jobs and nodes can be served from a `fleettune.controller.watch.WatchCache` fed by the
operator's own watches (kopf's Job and node events), and the verdicts of trial Pods from
its `EndedPods`.

With ``background_deletes``, ``delete_job`` hands the deletion to a
`fleettune.controller.deleter.BackgroundDeleter` and returns at once (the Job is already out
of the cache); with ``follow_answers``, running batch Pods' logs are read for their answers
by `fleettune.controller.logfollow.LogFollowers`. Both modules state their contracts.

"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from fleettune import GROUP, PLURAL, VERSION
from fleettune.controller.deleter import BackgroundDeleter
from fleettune.controller.logfollow import LogFollowers
from fleettune.controller.observed import JobBody, NodeBody, PodBody
from fleettune.controller.watch import (
    EndedPods,
    StreamedAnswers,
    WatchCache,
    job_name_of,
    parse_selector,
)
from fleettune.kubeapi import manifest, raw_json
from fleettune.labels import JOB_NAME_LABEL, MANAGED_BY, MANAGER
from fleettune.names import bounded

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


WORKER_KUBECONFIGS_ENV = "FLEETTUNE_WORKER_KUBECONFIGS"


def load_workers(directory: str | None = None) -> dict[str, client.ApiClient]:
    """Clients of the worker clusters that MultiKueue dispatches trial Jobs to (docs/operations/multikueue.md),
    one per entry of ``directory`` (default: $FLEETTUNE_WORKER_KUBECONFIGS): a kubeconfig
    file, or a folder holding a file ``kubeconfig`` (a mounted Secret), named by the entry.
    MultiKueue mirrors a worker's Job status, not its Pods: the operator reads a dispatched
    trial's Pod, and the pool's nodes, from the worker itself. Unset: none."""
    root = directory if directory is not None else os.environ.get(WORKER_KUBECONFIGS_ENV, "").strip()
    if not root:
        return {}
    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"{WORKER_KUBECONFIGS_ENV}={root!r}: not a folder of kubeconfigs")
    workers: dict[str, client.ApiClient] = {}
    for entry in sorted(base.iterdir()):
        path = entry / "kubeconfig" if entry.is_dir() else entry
        if entry.name.startswith(".") or not path.is_file():
            continue  # a mounted Secret's ..data links
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(path), client_configuration=cfg)
        workers[entry.name] = client.ApiClient(cfg)
    return workers


def _cached_list(cache: WatchCache | None, namespace: str, selector: str,
                 call: Callable[[], Any]) -> list[dict[str, Any]]:
    """``selector``'s objects from ``cache`` when it is fresh, else from ``call`` (a raw list
    request), whose answer then refreshes the cache."""
    if cache is not None:
        cached = cache.select(namespace, selector)
        if cached is not None:
            return cached
    started = time.monotonic()
    raw = raw_json(call())
    items = raw["items"]
    if cache is not None:
        cache.listed(namespace, selector, items, (raw.get("metadata") or {}).get("resourceVersion"), started)
    return items


class Kube:
    DELETERS = 8  # background deletion threads
    WORKER_NODES_MAX_AGE_S = 10.0  # how long the MultiKueue workers' nodes, as listed, serve every run

    def __init__(self, api: client.ApiClient | None = None, job_cache: WatchCache | None = None,
                 node_cache: WatchCache | None = None, background_deletes: bool = False,
                 ended_pods: EndedPods | None = None, workers: Mapping[str, client.ApiClient] | None = None,
                 streamed: StreamedAnswers | None = None, follow_answers: int = 0) -> None:
        self.api = api or load_api_client()
        # Running batch Pods' answers, read from their logs (`follow_answers`), at most
        # ``follow_answers`` Pods at once, on connections of their own: a followed log holds
        # its connection for the Pod's life, and must not starve the steps' calls.
        self.streamed = streamed if streamed is not None else StreamedAnswers()
        self.followers = LogFollowers(self.api, self.streamed, follow_answers)
        self.workers = dict(workers or {})  # MultiKueue worker clusters, by name (`load_workers`)
        self.remote_pods = EndedPods(key=job_name_of)  # the workers' trial Pods, by Job name
        self._watched: set[str] = set()  # namespaces whose trial Pods are watched in every worker
        self._watch_lock = threading.Lock()
        self._worker_nodes: tuple[float, list[NodeBody]] | None = None  # (monotonic time, nodes)
        self.job_cache = job_cache
        self.node_cache = node_cache
        self.ended_pods = ended_pods
        self.deleter = (BackgroundDeleter(job_cache, self._delete_job, self.DELETERS)
                        if background_deletes and job_cache is not None else None)

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def follow_answers(self, pod: Mapping[str, Any], on_answer: Callable[[], object]) -> bool:
        """Read a running batch Pod's log as it is written, into `streamed` (by its Job's uid);
        ``on_answer`` is called (from the follower's thread) after each new answer. False when
        not started (`LogFollowers.follow`: that Pod's answers then come at its end)."""
        return self.followers.follow(pod, on_answer)

    @cached_property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @staticmethod
    def _items(resp: Any) -> list[dict[str, Any]]:
        return list(raw_json(resp)["items"])

    def list_jobs(self, namespace: str, selector: str) -> list[JobBody]:
        """The Jobs matching ``selector``: from the watch-fed cache when it is fresh, else a real list.

        The bodies may be shared with the cache: do not modify them.
        """
        return _cached_list(self.job_cache, namespace, selector, lambda: self.batch.list_namespaced_job(
            namespace, label_selector=selector, _preload_content=False))

    def list_pods(self, namespace: str, selector: str) -> list[PodBody]:
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

    def job_pods(self, namespace: str, job: str) -> list[PodBody]:
        """The Pods of trial Job ``job``: in this cluster, else in the worker cluster that
        MultiKueue dispatched it to (the same name and namespace there): its ended Pod as the
        worker watch kept it (`watch_workers`), or as listed there now."""
        selector = f"{JOB_NAME_LABEL}={job}"
        pods = self.list_pods(namespace, selector)
        if not pods and (kept := self.remote_pods.get(namespace, job)) is not None:
            pods = [kept]
        for name, api in self.workers.items():
            if pods:
                break
            try:
                pods = self._items(client.CoreV1Api(api).list_namespaced_pod(
                    namespace, label_selector=selector, _preload_content=False))
            except (ApiException, OSError) as exc:
                log.warning("worker cluster %s: cannot list the Pods of %s/%s: %s", name, namespace, job,
                            bounded(str(exc), 300))
        return pods

    def list_fleet_nodes(self) -> list[NodeBody]:
        """This cluster's nodes and the worker clusters' (named ``WORKER/NODE``), whose pools a
        run tunes through MultiKueue; a worker that does not answer is left out and logged.
        The workers' nodes are listed at most every WORKER_NODES_MAX_AGE_S for all runs
        together (no watch there). The bodies may be shared: do not modify them."""
        return [*self.list_nodes(""), *self._list_worker_nodes()]

    def _list_worker_nodes(self) -> list[NodeBody]:
        cached = self._worker_nodes
        if not self.workers or (cached is not None and time.monotonic() - cached[0] < self.WORKER_NODES_MAX_AGE_S):
            return cached[1] if cached is not None else []
        started = time.monotonic()
        nodes: list[NodeBody] = []
        for name, api in self.workers.items():
            try:
                remote = self._items(client.CoreV1Api(api).list_node(_preload_content=False))
            except (ApiException, OSError) as exc:
                log.warning("worker cluster %s: cannot list its nodes: %s", name, bounded(str(exc), 300))
                continue
            for node in remote:
                node["metadata"]["name"] = f"{name}/{node['metadata']['name']}"
            nodes += remote
        self._worker_nodes = (started, nodes)
        return nodes

    def ended_pod(self, namespace: str, job: Mapping[str, Any]) -> PodBody | None:
        """The Pod of ``job`` whose end decides it, if a Pod watch (this cluster's, or a
        worker's for a Job MultiKueue dispatched) has shown one."""
        meta = job.get("metadata") or {}
        local = self.ended_pods.get(namespace, meta.get("uid")) if self.ended_pods is not None else None
        return local or (self.remote_pods.get(namespace, meta["name"]) if self.workers and meta.get("name") else None)

    def watch_workers(self, namespace: str) -> None:
        """Watch the trial Pods of ``namespace`` in every worker cluster (once; a daemon thread
        per worker), into `remote_pods`."""
        with self._watch_lock:
            if not self.workers or namespace in self._watched:
                return
            self._watched.add(namespace)
        for name, api in self.workers.items():
            threading.Thread(target=self._watch_worker, args=(name, api, namespace), daemon=True,
                             name=f"fleettune-worker-{name}").start()

    def _watch_worker(self, name: str, api: client.ApiClient, namespace: str) -> None:
        core = client.CoreV1Api(api)
        selector = f"{MANAGED_BY}={MANAGER}"
        while True:
            try:
                listed = raw_json(core.list_namespaced_pod(namespace, label_selector=selector,
                                                           _preload_content=False))
                for pod in listed["items"]:
                    self.remote_pods.observe(None, pod)
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                for event in watch.Watch().stream(core.list_namespaced_pod, namespace, label_selector=selector,
                                                  resource_version=rv, timeout_seconds=300, deserialize=False):
                    obj = event.get("raw_object") or event.get("object")
                    if isinstance(obj, dict) and obj.get("kind") != "Status":
                        self.remote_pods.observe(None, obj)
            except Exception as exc:  # a worker away, a watch expired: list again shortly
                log.warning("worker cluster %s: watching trial Pods in %s: %s", name, namespace,
                            bounded(str(exc), 300))
                time.sleep(1.0)

    def _job_rv(self, namespace: str, selector: str) -> str | None:
        cache = self.job_cache
        wanted = parse_selector(selector)
        if cache is None or wanted is None or set(wanted) != {"batch.kubernetes.io/job-name"}:
            return None
        job = cache.get(namespace, wanted["batch.kubernetes.io/job-name"])
        rv = (job or {}).get("metadata", {}).get("resourceVersion")
        return rv if isinstance(rv, str) and rv.isdigit() else None

    def list_nodes(self, selector: str) -> list[NodeBody]:
        """The nodes matching ``selector``: from the watch-fed cache when it is fresh, else a real list.

        The bodies may be shared with the cache: do not modify them.
        """
        return _cached_list(self.node_cache, "", selector, lambda: self.core.list_node(
            label_selector=selector, _preload_content=False))

    def create_job(self, namespace: str, body: JobBody) -> bool:
        """Create a Job; False if it already exists (a restarted operator adopting its work)."""
        try:
            resp = self.batch.create_namespaced_job(namespace, manifest(body), _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        if self.job_cache is not None:
            self.job_cache.created(raw_json(resp))
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and its Pods (gone already is fine); in the background with ``background_deletes``."""
        if self.deleter is not None and self.deleter.delete(namespace, name):
            return
        self._delete_job(namespace, name)
        if self.job_cache is not None:
            self.job_cache.deleted(namespace, name)

    def _delete_job(self, namespace: str, name: str) -> None:
        if self.workers:
            self.remote_pods.job_deleted(namespace, name)
        try:
            # Read the (unparsed) answer: an unread response never gives its connection back
            # to the pool, and every later call would open (and TLS-handshake) a new one.
            raw_json(self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background",
                                                      _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            data: dict[str, str] = self.core.read_namespaced_config_map(name, namespace).data or {}
            return data
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
        return raw_json(resp)

    def write_config_map(self, namespace: str, body: dict[str, Any], resource_version: str | None) -> str:
        """Create (``resource_version`` None) or wholly replace the version read: one write, so
        readers never see half an update, and never over a change made since the read (the
        apiserver answers 409 and nothing is written). Returns the new resourceVersion."""
        if resource_version is None:
            resp = self.core.create_namespaced_config_map(namespace, manifest(body), _preload_content=False)
        else:
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
            resp = self.core.replace_namespaced_config_map(body["metadata"]["name"], namespace, manifest(body),
                                                           _preload_content=False)
        return str(raw_json(resp)["metadata"]["resourceVersion"])

    def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, *,
                   count: int = 1, name: str | None = None) -> str | None:
        """A core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid): what
        `kubectl describe` and `kubectl events` show. With ``name`` (an Event this process
        wrote, `fleettune.controller.events`), that Event is updated to ``count`` occurrences,
        as Kubernetes' recorder does for a repeated event; a new one is created if it is
        gone (Events expire) or cannot be updated. Returns the Event's name, None when it
        could not be written: best effort, an event is never worth failing a step for."""
        when = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        namespace = involved["namespace"]
        if name is not None:
            patch = {"count": count, "lastTimestamp": when, "message": bounded(message, 1024)}
            try:
                self.core.patch_namespaced_event(name, namespace, patch, _preload_content=False)
                return name
            except Exception as exc:
                if not isinstance(exc, ApiException) or exc.status != 404:
                    log.warning("updating event %s on %s failed: %s", reason, involved.get("name"), str(exc)[:200])
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
            "count": count,
        }
        try:
            created = raw_json(self.core.create_namespaced_event(namespace, manifest(body), _preload_content=False))
        except Exception as exc:
            log.warning("posting event %s on %s failed: %s", reason, involved.get("name"), str(exc)[:200])
            return None
        return str(created.get("metadata", {}).get("name") or "") or None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )
