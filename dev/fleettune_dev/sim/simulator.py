"""The fleet simulator: answers trial Pods on KWOK fake GPU nodes like the real job would.

It watches Pods labelled ``app.kubernetes.io/managed-by=fleettune`` in all namespaces. When
one is Running on a node annotated ``kwok.x-k8s.io/node=fake`` (kwok's pod-ready stage put
it there), it reads the batch from the ``FLEETTUNE_TRIAL`` env of the ``trial`` container
(every trial Pod measures a batch, of one configuration or several) and answers it entry
by entry from the node pool's recording (or synthetic model), on the timeline of
``fleettune_dev.sim.batch``: compiles run ahead on the node's CPU cores while the GPU
checks and times the configurations already compiled. When the simulated duration ×
``time_scale`` is up, it writes the Pod's status the way a kubelet would after the
container exited: ``state.terminated`` with the whole ``BatchResult`` as ``message`` and
its exit code, phase Succeeded or Failed. The Job controller and the operator then see
exactly what they would see on a real GPU node. Pods on real nodes are never touched.

A Pod that gets a deletionTimestamp while it runs (deleted, evicted) is stopped as a
kubelet stops it: terminated with exit code 137 and the answers its simulated time had
reached (``done=False``, error ``terminated``).

With ``startup`` (a :class:`~fleettune_dev.sim.startup.PodStartup`), every Pod first spends
a seeded draw of the container's start-up (interpreter, imports, CUDA context) before its
first configuration; off by default.

User-source trials are compiled for real with NVRTC (the source comes from the ConfigMap
the Pod mounts), so compile errors are the compiler's own; their times come from a
synthetic model (``fleettune_dev.sim.usersource``).

A node that is deleted takes its Pods' answers with it: a Pod whose node is gone (or was
replaced by a new node of the same name) when its answer is due is never completed, just
as a dead machine's kubelet never reports. The control plane then does what it does with
such a Pod: the pod garbage collector marks it Failed with a ``DisruptionTarget``
condition and deletes it, and the Job replaces it.

kwok must not load its ``pod-complete`` stage (it would complete the Pod first, with exit 0
and no message); ``fleettune cluster up`` does not load it.

API calls (reading a Pod's node when it starts, writing its result when it ends) run on a
small pool of worker threads, so that a fleet of hundreds of GPUs is answered on time even
when every call waits tens of milliseconds on a busy apiserver. Pods are handled as raw
JSON, and a Pod's last state comes from the watch, not from a read before its result is
written: at fleet scale the simulator shares the machine with the control plane it feeds.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from fleettune.labels import MANAGED_BY, MANAGER
from fleettune_dev.cluster.fleet import KWOK_ANNOTATION, Fleet, NodePool
from fleettune_dev.sim.answer import DEFAULT_COMPILE_S, infra
from fleettune_dev.sim.batch import BatchAnswer
from fleettune_dev.sim.ending import PodEnding
from fleettune_dev.sim.kubelet import Due
from fleettune_dev.sim.podanswers import PodAnswers
from fleettune_dev.sim.podlogs import PodLogs
from fleettune_dev.sim.podspec import started_at, trial_env, trial_id
from fleettune_dev.sim.rawwatch import WatchExpired, raw_list, raw_watch
from fleettune_dev.sim.recordings import KernelModel
from fleettune_dev.sim.startup import PodStartup
from fleettune_dev.sim.usersource import ConfigMapReader, config_map_data
from fleettune_job.protocol import Answer as Verdict

log = logging.getLogger("fleettune.sim")  # the name in the simulator's log lines

MANAGED_SELECTOR = f"{MANAGED_BY}={MANAGER}"


class FleetSimulator(PodEnding):
    """Answer trial Pods on fake nodes; see the module docstring.

    ``time_scale`` multiplies simulated durations (1.0: a trial takes about as long as on
    the GPU, compile included: ~0.9 s for the convolution kernel). ``seed`` fixes the
    synthetic models' noise and the start-up draws. ``startup``: model each Pod's start-up
    (None: Pods start measuring at once, as before). Counters: ``answered`` (one
    ``(namespace, run, target, index)`` per answered configuration, in completion order: a
    batch Pod adds one per answer it wrote; ``("ns", "", "", -1)`` for a Pod without a
    readable trial), ``outcomes`` (count per answered configuration's outcome, and one
    ``infra_error`` per batch Pod stopped by an infrastructure failure), ``ignored``
    (Pods on real nodes), ``lost`` (Pods left unanswered because their node was deleted),
    ``terminated`` (Pods stopped mid-batch by their deletion), ``errors`` (API
    failures, most recent last). ``compiler`` compiles user source (its ``compiles`` counts
    NVRTC runs).
    """

    def __init__(self, kubeconfig: Path | str, fleet: Fleet, time_scale: float = 1.0, seed: int = 0, *,
                 compile_s: float = DEFAULT_COMPILE_S, label_selector: str = MANAGED_SELECTOR,
                 workers: int = 16, startup: PodStartup | None = None) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.kubeconfig = Path(kubeconfig)
        self.fleet = fleet
        self.time_scale = time_scale
        self.seed = seed
        self.compile_s = compile_s
        self.startup = startup
        self.label_selector = label_selector
        self.answered: list[tuple[str, str, str, int]] = []
        # Answers whose write was sent, its reply lost, and its Pod deleted before it could
        # be read back: the operator may or may not have seen them.
        self.unsettled: list[tuple[str, str, str, int]] = []
        self.outcomes: Counter[str] = Counter()
        self.ignored = 0
        self.lost = 0
        self.terminated = 0
        self.errors: list[str] = []
        # What each Pod answers (its `compiler` compiles user source).
        self.answers = PodAnswers(fleet, seed, compile_s)
        self.compiler = self.answers.compiler
        self.workers = max(1, workers)
        self._seen: set[str] = set()
        self._starting: set[str] = set()  # Pods whose node is being read
        self._running: set[str] = set()  # Pods Running and not being deleted, per the watch
        self._batches: dict[str, Due] = {}  # batch Pods answered but not yet written, by uid
        self._stopping: set[str] = set()  # batch Pods deleted before they were answered
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._heap: list[Due] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Batch Pods' answer lines, served by kwok as their logs (a folder of its own, removed at stop).
        self.podlogs = PodLogs()
        # Node name -> uid, per the node watch; None until its first list.
        self._nodes: dict[str, str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FleetSimulator:
        if self._threads:
            return self
        self._stop.clear()
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="fleettune-sim-api")
        self.podlogs.start()
        self._threads = [
            threading.Thread(target=self._node_loop, name="fleettune-sim-nodes", daemon=True),
            threading.Thread(target=self._watch_loop, name="fleettune-sim-watch", daemon=True),
            threading.Thread(target=self._complete_loop, name="fleettune-sim-complete", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout)
        self._threads = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.podlogs.stop()

    def __enter__(self) -> FleetSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_answered(self, n: int, timeout: float = 60.0) -> bool:
        """Block until at least ``n`` Pods have been answered (for tests and demos)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self.answered) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.5))
        return True

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    # ------------------------------------------------------------------ kubernetes
    def _api(self) -> Any:
        from kubernetes import client, config

        # One client per thread: ApiClient is not meant to be shared between threads.
        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))

    def _worker_api(self) -> Any:
        api = getattr(self._local, "api", None)
        if api is None:
            api = self._local.api = self._api()
        return api

    def _submit(self, fn: Any, *args: Any) -> bool:
        pool = self._pool
        if pool is None or self._stop.is_set():
            return False
        try:
            pool.submit(fn, *args)
        except RuntimeError:  # shut down meanwhile
            return False
        return True

    def _record_error(self, msg: str) -> None:
        log.warning("%s", msg)
        self.errors = [*self.errors[-49:], msg]

    def _watch_loop(self) -> None:
        core = self._api()
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    pods, rv = raw_list(core.list_pod_for_all_namespaces, label_selector=self.label_selector,
                                        _request_timeout=30)
                    live = {p["metadata"]["uid"] for p in pods}
                    with self._cv:  # forget Pods deleted while we were not watching (not all: a
                        self._running &= live  # running Pod's result may be written meanwhile)
                    for pod in pods:
                        self._consider("ADDED", pod)
                # Short server-side timeouts keep stop() prompt; resuming from rv loses nothing.
                for kind, pod in raw_watch(core.list_pod_for_all_namespaces, label_selector=self.label_selector,
                                           resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True,
                                           _request_timeout=30):
                    rv = pod["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self._consider(kind, pod)
                    if self._stop.is_set():
                        break
            except Exception as exc:
                if self._watch_failed("pods", exc):
                    rv = None

    def _watch_failed(self, what: str, exc: Exception) -> bool:
        """True when the watch's resourceVersion expired (list again); otherwise (apiserver
        restarts, connection resets) record the error and pause before retrying."""
        if isinstance(exc, WatchExpired) or (isinstance(exc, ApiException) and exc.status == 410):
            return True
        text = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
        self._record_error(f"watching {what}: {text}")
        self._stop.wait(1.0)
        return False

    def _node_loop(self) -> None:
        """Keep the names and uids of the nodes that exist (to tell a lost node's Pods)."""
        core = self._api()
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    nodes, rv = raw_list(core.list_node, _request_timeout=30)
                    current = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes}
                    with self._cv:
                        self._nodes = current
                for kind, node in raw_watch(core.list_node, resource_version=rv, timeout_seconds=1,
                                            allow_watch_bookmarks=True, _request_timeout=30):
                    meta = node["metadata"]
                    rv = meta["resourceVersion"]
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        with self._cv:
                            nodes = self._nodes if self._nodes is not None else {}
                            if kind != "DELETED":
                                nodes[meta["name"]] = meta["uid"]
                            elif nodes.get(meta["name"]) == meta["uid"]:
                                del nodes[meta["name"]]
                            self._nodes = nodes
                    if self._stop.is_set():
                        break
            except Exception as exc:
                if self._watch_failed("nodes", exc):
                    rv = None

    def _node_lost(self, core: Any, due: Due) -> bool:
        """Whether the node the Pod ran on is gone (deleted, or replaced under its name)."""
        with self._cv:
            if self._nodes is not None and self._nodes.get(due.node) == due.node_uid:
                return False
        try:  # gone, or the watch is behind (not listed yet, a node just created): ask
            node = json.loads(core.read_node(due.node, _request_timeout=10, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return node["metadata"]["uid"] != due.node_uid

    def _consider(self, kind: str, pod: dict[str, Any]) -> None:
        """A Pod event: note whether it is still running, schedule the answer of a Pod
        newly Running, and stop a batch Pod being deleted, on the worker pool (the watch
        thread must not wait on the API)."""
        meta = pod["metadata"]
        uid = meta["uid"]
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        deleting = kind != "DELETED" and meta.get("deletionTimestamp") is not None
        running = kind != "DELETED" and not deleting and bool(node) and phase == "Running"
        killed: Due | None = None
        with self._cv:
            if running:
                self._running.add(uid)
                if uid in self._seen or uid in self._starting:
                    return
                self._starting.add(uid)
            else:
                self._running.discard(uid)
                killed = self._batches.pop(uid, None)
        if not running:
            # A trial Pod deleted while it measures is stopped; one that ended already is left alone.
            if deleting and phase == "Running":
                if killed is not None:
                    self._submit(self._terminate_on_worker, killed, meta.get("resourceVersion", ""))
                elif uid not in self._stopping and trial_env(pod) is not None:
                    self._stopping.add(uid)  # one try: its later events must not stop it again
                    self._submit(self._stop_untracked_on_worker, pod)
            return
        if not self._submit(self._start_on_worker, pod):
            with self._cv:
                self._starting.discard(uid)

    def _start_on_worker(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self._start(self._worker_api(), pod)
        except Exception as exc:  # a bug must not kill the pool's thread silently
            self._record_error(f"starting {meta.get('namespace')}/{meta.get('name')}: {type(exc).__name__}: {exc}")
        finally:
            with self._cv:
                self._starting.discard(meta["uid"])

    def _start(self, core: Any, pod: dict[str, Any]) -> None:
        meta, node_name = pod["metadata"], pod["spec"]["nodeName"]
        uid = meta["uid"]
        if uid in self._seen:
            return
        began = time.monotonic()  # the trial runs while the simulator reads and compiles
        try:
            # Raw: only the annotations and labels are needed, not the client's models.
            resp = core.read_node(node_name, _request_timeout=10, _preload_content=False)
            node: dict[str, Any] | None = json.loads(resp.data)
        except ApiException as exc:
            if exc.status != 404:
                # One pod must not stall the others: note it, retry on its next event.
                self._record_error(f"reading node {node_name}: HTTP {exc.status} {exc.reason}")
                return
            node = None  # a pod bound to a node that is gone: nobody's GPU, leave it to pod GC
        node_meta = (node or {}).get("metadata") or {}
        if node is None or (node_meta.get("annotations") or {}).get(KWOK_ANNOTATION) != "fake":
            with self._cv:
                if uid not in self._seen:
                    self._seen.add(uid)
                    if node is None:
                        self.lost += 1
                    else:
                        self.ignored += 1
            return
        labels = dict(node_meta.get("labels") or {})
        namespace = meta.get("namespace", "")
        try:
            answer = self.answer(pod, labels, config_maps=lambda name: self._read_config_map(core, namespace, name))
        except Exception as exc:  # a bug or an unreadable recording: fail this Pod, not the loop
            self._record_error(f"answering {meta.get('namespace')}/{meta.get('name')}: {exc!r}")
            answer = BatchAnswer.failed(infra(f"internal error: {exc!r}"))
        startup_s = self.startup.for_pod(self.seed, uid) if self.startup is not None else 0.0
        due = self._due(pod, node_meta.get("uid", ""), answer, began=began, startup_s=startup_s)
        with self._cv:
            if uid in self._seen:
                return
            self._seen.add(uid)
            heapq.heappush(self._heap, due)
            # Only a Pod still running can be stopped mid-batch; one deleted meanwhile was
            # ended by kwok already.
            if uid in self._running:
                self._batches[uid] = due
            self._cv.notify_all()
        if answer.answers and self.podlogs.open(
                client.CustomObjectsApi(core.api_client), pod):
            for timed in answer.answers:  # each printed the moment it is measured, as the job image does
                self.podlogs.print_at(uid, due.began + (startup_s + timed.at_s) * self.time_scale,
                                      Verdict.of(timed.index, timed.answer.result).line())

    def _due(self, pod: dict[str, Any], node_uid: str, answer: BatchAnswer, *, began: float,
             startup_s: float = 0.0) -> Due:
        """The Pod's answer, due when its simulated time is up."""
        meta = pod["metadata"]
        return Due(at=began + (startup_s + answer.duration_s) * self.time_scale, seq=next(self._seq),
                    namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], node=pod["spec"]["nodeName"],
                    node_uid=node_uid, answer=answer, trial=trial_id(pod), started=started_at(pod),
                    containers=[(c["name"], c.get("image", "")) for c in pod["spec"]["containers"]],
                    began=began, startup_s=startup_s)

    @staticmethod
    def _read_config_map(core: Any, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            resp = core.read_namespaced_config_map(name, namespace, _request_timeout=10, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeError(f"HTTP {exc.status} {exc.reason}") from None
        return config_map_data(json.loads(resp.data))

    def answer(self, pod: dict[str, Any], node_labels: dict[str, str],
               config_maps: ConfigMapReader | None = None) -> BatchAnswer:
        """What a Pod on a node with these labels answers (:meth:`PodAnswers.answer`)."""
        return self.answers.answer(pod, node_labels, config_maps)

    def model(self, pool: NodePool, kernel: str) -> KernelModel | None:
        return self.answers.model(pool, kernel)

    def _complete_loop(self) -> None:
        """Hand each due Pod to the worker pool the moment its trial ends."""
        while not self._stop.is_set():
            with self._cv:
                while not self._stop.is_set() and (not self._heap or self._heap[0].at > time.monotonic()):
                    wait = self._heap[0].at - time.monotonic() if self._heap else 1.0
                    self._cv.wait(max(0.0, min(wait, 1.0)))
                if self._stop.is_set():
                    return
                due = heapq.heappop(self._heap)
            if not self._submit(self._complete_on_worker, due):
                return

