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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from fleettune.labels import MANAGED_BY, MANAGER, POOL_LABEL
from fleettune_dev.cluster.fleet import KWOK_ANNOTATION, Fleet, NodePool
from fleettune_dev.sim.answer import (
    DEFAULT_COMPILE_S,
    Answer,
    answer_measurement,
    answer_trial,
    fingerprint,
    infra,
    invalid_configuration,
)
from fleettune_dev.sim.batch import BatchAnswer, answer_batch, compile_slots
from fleettune_dev.sim.builtin import answer_builtin
from fleettune_dev.sim.podlogs import PodLogs
from fleettune_dev.sim.rawwatch import WatchExpired, raw_list, raw_watch
from fleettune_dev.sim.recordings import KernelModel, RecordedKernel, SyntheticKernel, load_recording
from fleettune_dev.sim.startup import PodStartup
from fleettune_dev.sim.usersource import (
    Compiler,
    ConfigMapReader,
    SourceUnavailable,
    compile_defines,
    config_map_data,
    launch_geometry,
    launch_refused,
    source_location,
    synthetic_measurement,
)
from fleettune_job.kernels import BUILTINS
from fleettune_job.protocol import (
    CONTAINER_NAME,
    TRIAL_ENV,
    Batch,
    BatchResult,
    Fingerprint,
    Outcome,
    Trial,
)
from fleettune_job.protocol import Answer as Verdict

log = logging.getLogger("fleettune.sim")  # the name in the simulator's log lines

MANAGED_SELECTOR = f"{MANAGED_BY}={MANAGER}"
KILLED_EXIT_CODE = 137  # 128 + SIGKILL: what a kubelet reports for a container it stopped


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    namespace: str
    name: str
    uid: str
    node: str
    node_uid: str
    answer: BatchAnswer
    trial: tuple[str, str, str, int]  # (namespace, run, target, -1): its answers name their indexes
    containers: list[tuple[str, str]]  # (name, image)
    started: dict[str, str]  # container name -> startedAt
    tries: int = 0
    # The last status write sent (message, result, killed): stored, perhaps, though its reply was lost.
    sent: tuple[str, BatchResult, bool] | None = None
    settled: bool = False  # counted as answered (or unsettled): once only
    began: float = 0.0  # monotonic time the Pod was seen Running
    startup_s: float = 0.0  # simulated start-up before its first configuration

    def elapsed_s(self, now: float, time_scale: float) -> float:
        """Simulated seconds since the Pod's start-up ended (everything is over at time scale 0)."""
        return (now - self.began) / time_scale - self.startup_s if time_scale > 0 else float("inf")


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _trial_container(pod: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The container carrying the trial, and the trial's text."""
    containers = list((pod.get("spec") or {}).get("containers") or [])
    # The job's container is named `trial`; fall back to any container carrying the env.
    containers.sort(key=lambda c: c.get("name") != CONTAINER_NAME)
    for c in containers:
        for env in c.get("env") or []:
            if env.get("name") == TRIAL_ENV:
                return c, env.get("value") or ""
    return None


def _env(pod: dict[str, Any]) -> dict[str, str]:
    """The trial container's environment (literal values)."""
    found = _trial_container(pod)
    return {e["name"]: e.get("value") or "" for e in (found[0].get("env") or [] if found else [])}


def _trial_env(pod: dict[str, Any]) -> str | None:
    found = _trial_container(pod)
    return found[1] if found else None


def _started_at(pod: dict[str, Any]) -> dict[str, str]:
    out = {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        begun = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        if begun:
            out[status["name"]] = begun
    return out


def _trial_id(pod: dict[str, Any]) -> tuple[str, str, str, int]:
    ns = pod["metadata"].get("namespace", "")
    try:
        work = Batch.from_env(_trial_env(pod) or "")
    except ValueError:
        return (ns, "", "", -1)
    return (ns, work.run, work.target, -1)


class FleetSimulator:
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
        self.compiler = Compiler()
        self.workers = max(1, workers)
        self._seen: set[str] = set()
        self._starting: set[str] = set()  # Pods whose node is being read
        self._running: set[str] = set()  # Pods Running and not being deleted, per the watch
        self._batches: dict[str, _Due] = {}  # batch Pods answered but not yet written, by uid
        self._stopping: set[str] = set()  # batch Pods deleted before they were answered
        self._local = threading.local()
        self._answering = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._models: dict[tuple[str, str], KernelModel] = {}
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

    def _node_lost(self, core: Any, due: _Due) -> bool:
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
        killed: _Due | None = None
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
                elif uid not in self._stopping and _trial_env(pod) is not None:
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
             startup_s: float = 0.0) -> _Due:
        """The Pod's answer, due when its simulated time is up."""
        meta = pod["metadata"]
        return _Due(at=began + (startup_s + answer.duration_s) * self.time_scale, seq=next(self._seq),
                    namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], node=pod["spec"]["nodeName"],
                    node_uid=node_uid, answer=answer, trial=_trial_id(pod), started=_started_at(pod),
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
        """What a Pod on a node with these labels answers, on its timeline; a Pod whose batch
        cannot be read stops before its first configuration (an infrastructure failure).
        ``config_maps`` reads the ConfigMaps of the Pod's namespace (user source); it is the
        only API access."""
        text = _trial_env(pod)
        pool_name = node_labels.get(POOL_LABEL)
        try:
            pool = self.fleet.pool(pool_name or "")
        except KeyError:
            return BatchAnswer.failed(infra(
                f"node {pod['spec'].get('nodeName')} has no pool of the fleet ({POOL_LABEL}={pool_name})"))
        if text is None:
            return BatchAnswer.failed(infra(f"no {TRIAL_ENV} value in the pod's containers", pool, node_labels))
        try:
            work = Batch.from_env(text)
        except ValueError as exc:
            return BatchAnswer.failed(infra(f"invalid {TRIAL_ENV}: {str(exc).splitlines()[0]}", pool, node_labels))
        # Entry by entry (user source is compiled once: the compiler caches its verdicts).
        answers = [self._answer_trial(pod, trial, pool, node_labels, config_maps) for trial in work.trials()]
        return answer_batch(work, answers, compile_slots(pool, _env(pod)))

    def _answer_trial(self, pod: dict[str, Any], trial: Trial, pool: NodePool, node_labels: dict[str, str],
                      config_maps: ConfigMapReader | None) -> Answer:
        if trial.kernel.source_path:
            return self._answer_source(pod, trial, pool, node_labels, config_maps)
        kernel = trial.kernel.builtin
        if kernel is None:
            return infra("the trial names neither a built-in kernel nor a source_path", pool, node_labels)
        with self._answering:  # the models (and their noise generators) are not shared between threads
            model = self.model(pool, kernel)
            if model is not None:
                return answer_trial(trial, pool, node_labels, model, compile_s=self.compile_s)
        desc = BUILTINS.get(kernel)
        if desc is None:
            return infra(f"pool {pool.name} has no recording or synthetic model for kernel {kernel!r}, and it is "
                         f"not a built-in kernel (built-ins: {', '.join(sorted(BUILTINS))})", pool, node_labels)
        # Nobody recorded this kernel on this GPU: the model of the kernel itself (synthetic).
        return answer_builtin(trial, pool, node_labels, desc, seed=self.seed, compile_s=self.compile_s)

    def _answer_source(self, pod: dict[str, Any], trial: Trial, pool: NodePool, labels: dict[str, str],
                       config_maps: ConfigMapReader | None) -> Answer:
        """User source: read from the Pod's ConfigMap volume, compiled with NVRTC for the
        node's compute capability, timed by the synthetic model when it compiles."""
        path = trial.kernel.source_path or ""
        found = _trial_container(pod)
        assert found is not None  # the trial was read from it
        try:
            cm_name, key = source_location(found[0], list((pod.get("spec") or {}).get("volumes") or []), path)
        except SourceUnavailable as exc:
            return infra(f"cannot read kernel source {path}: {exc}", pool, labels)
        if config_maps is None:
            return infra(f"cannot read kernel source {path}: no API access to ConfigMap {cm_name}", pool, labels)
        try:
            data = config_maps(cm_name)
        except Exception as exc:
            return infra(f"cannot read kernel source {path}: reading ConfigMap {cm_name}: {exc}", pool, labels)
        if data is None:
            return infra(f"cannot read kernel source {path}: ConfigMap {cm_name} not found", pool, labels)
        if key not in data:
            return infra(f"cannot read kernel source {path}: ConfigMap {cm_name} has no key {key!r}", pool, labels)
        if not self.compiler.available():
            return infra("libnvrtc not found: the simulator compiles user kernel source with NVRTC "
                         "(pip install nvidia-cuda-nvrtc-cu12, or set FLEETTUNE_NVRTC to libnvrtc.so)", pool, labels)
        source = data[key]
        # In the job's order: geometry and defines, the compile, the launch.
        try:
            geometry = launch_geometry(trial)
        except ValueError as exc:
            return invalid_configuration(Outcome.LAUNCH_ERROR, f"launch geometry: {exc}", pool, labels, compile_s=0)
        try:
            defines = compile_defines(trial)
        except ValueError as exc:
            return invalid_configuration(Outcome.COMPILE_ERROR, str(exc), pool, labels, compile_s=0)
        device = fingerprint(pool, labels, synthetic=True)
        verdict = self.compiler.check(source, defines, trial.kernel.function or "", device.compute_capability)
        if verdict is not None:
            return invalid_configuration(Outcome.COMPILE_ERROR, verdict, pool, labels, compile_s=self.compile_s)
        refused = launch_refused(*geometry) if geometry else None
        if refused is not None:
            return invalid_configuration(Outcome.LAUNCH_ERROR, refused, pool, labels, compile_s=self.compile_s)
        m = synthetic_measurement(source, trial, f"{device.product}/{device.compute_capability}", self.seed)
        return answer_measurement(trial, pool, labels, m, compile_s=self.compile_s)

    def model(self, pool: NodePool, kernel: str) -> KernelModel | None:
        key = (pool.name, kernel)
        if key not in self._models:
            sim = pool.simulation
            if kernel in sim.recordings:
                rec = load_recording(self.fleet.recording_path(sim.recordings[kernel]))
                self._models[key] = RecordedKernel(rec)
            elif kernel in sim.synthetic:
                spec = sim.synthetic[kernel]
                rec = load_recording(self.fleet.recording_path(spec.source))
                self._models[key] = SyntheticKernel(rec, slowdown=spec.slowdown, noise=spec.noise,
                                                    seed=self.seed, label=f"{pool.name}/{kernel}")
            else:
                return None
        return self._models[key]

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

    def _complete_on_worker(self, due: _Due) -> None:
        try:
            self._complete(self._worker_api(), due)
        except Exception as exc:  # keep trying while the apiserver restarts
            self._record_error(f"completing {due.namespace}/{due.name}: {type(exc).__name__}: {exc}")
            if due.tries < 30:
                due.tries += 1
                due.at = time.monotonic() + 1.0
                with self._cv:
                    heapq.heappush(self._heap, due)
                    if due.uid in self._running:
                        self._batches[due.uid] = due  # still stoppable by its deletion meanwhile
                    self._cv.notify_all()

    def _complete(self, core: Any, due: _Due) -> None:
        with self._cv:
            # Deleted, being deleted, or ended meanwhile (run cancelled, Job deleted); a
            # batch's end or its deletion, whichever comes first, writes its status.
            ended = due.uid not in self._running or self._batches.pop(due.uid, None) is None
        if due.sent is not None and self._landed(core, due):
            return
        if ended:
            return
        self.podlogs.close(due.uid)
        if self._gone_with_node(core, due):
            return
        result = due.answer.result
        due.sent = (message := result.encode(), result, False)
        if self._write_status(core, due, result.exit_code, message):
            self._answered(due, result)
        else:
            due.sent = None  # refused: not stored

    def _landed(self, core: Any, due: _Due) -> bool:
        """After a status write whose reply was lost (an apiserver that stored it and died
        before answering): whether it was stored, read back from the Pod. A Pod deleted
        meanwhile cannot tell, so its answers are `unsettled`, neither answered nor lost."""
        assert due.sent is not None
        message, result, killed = due.sent
        try:
            pod = json.loads(core.read_namespaced_pod(due.name, due.namespace, _request_timeout=10,
                                                      _preload_content=False).data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            with self._cv:
                self._running.discard(due.uid)
                if not due.settled:
                    due.settled = True
                    self.unsettled.extend(self._keys(due, result))
                self._cv.notify_all()
            log.info("%s/%s: deleted before its lost status write could be read back", due.namespace, due.name)
            return True
        if pod["metadata"].get("uid") != due.uid:
            return False
        messages = [((s.get("state") or {}).get("terminated") or {}).get("message")
                    for s in (pod.get("status") or {}).get("containerStatuses") or ()]
        if message not in messages:
            return False
        self._answered(due, result, killed=killed)
        return True

    @staticmethod
    def _keys(due: _Due, result: BatchResult) -> list[tuple[str, str, str, int]]:
        """The trials a result answers: each of its answers."""
        ns, run, target, _ = due.trial
        return [(ns, run, target, a.i) for a in result.answers]

    def _terminate_on_worker(self, due: _Due, resource_version: str) -> None:
        try:
            self._terminate(self._worker_api(), due, resource_version)
        except Exception as exc:  # kwok's own stage still ends the Pod (without its answers)
            self._record_error(f"stopping {due.namespace}/{due.name}: {type(exc).__name__}: {exc}")
            if due.sent is not None:  # its answers may have been stored: read the Pod back later
                due.at = time.monotonic() + 1.0
                with self._cv:
                    heapq.heappush(self._heap, due)
                    self._cv.notify_all()

    def _terminate(self, core: Any, due: _Due, resource_version: str, elapsed_s: float | None = None) -> None:
        """A batch Pod deleted while it ran: its container is killed (exit 137, what a
        kubelet reports) with the answers it had written ``elapsed_s`` after its start-up
        (default: by the clock); one whose simulated time was up had exited by itself.
        Written only over the running Pod last seen (its resourceVersion): a Pod that ended
        meanwhile keeps its status."""
        self.podlogs.close(due.uid)  # killed: it prints nothing more
        if self._gone_with_node(core, due):
            return
        for _ in range(3):
            elapsed = due.elapsed_s(time.monotonic(), self.time_scale) if elapsed_s is None else elapsed_s
            finished = elapsed >= due.answer.duration_s
            result = due.answer.result if finished else due.answer.terminated(elapsed)
            code = result.exit_code if finished else KILLED_EXIT_CODE
            due.sent = (message := result.encode(), result, not finished)
            if self._write_status(core, due, code, message, resource_version):
                self._answered(due, result, killed=not finished)
                return
            due.sent = None  # refused: not stored
            try:  # changed since: by kwok ending it, or by something harmless (a label)
                pod = json.loads(core.read_namespaced_pod(due.name, due.namespace, _request_timeout=10,
                                                          _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if pod["metadata"].get("uid") != due.uid or (pod.get("status") or {}).get("phase") != "Running":
                return
            resource_version = pod["metadata"]["resourceVersion"]

    def _stop_untracked_on_worker(self, pod: dict[str, Any]) -> None:
        try:
            self._stop_untracked(self._worker_api(), pod)
        except Exception as exc:
            meta = pod["metadata"]
            self._record_error(f"stopping {meta.get('namespace')}/{meta.get('name')}: {type(exc).__name__}: {exc}")

    def _stop_untracked(self, core: Any, pod: dict[str, Any]) -> None:
        """A batch Pod on a fake node deleted before the simulator answered it (it was
        starting, or the simulator was not watching): killed before its first answer."""
        meta, node_name = pod["metadata"], pod["spec"]["nodeName"]
        try:
            node = json.loads(core.read_node(node_name, _request_timeout=10, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return  # gone with its node: nothing reports
            raise
        if (node["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) != "fake":
            return  # a real kubelet's
        nothing = BatchAnswer(Fingerprint(simulated=True), (), float("inf"))
        due = self._due(pod, node["metadata"]["uid"], nothing, began=time.monotonic())
        self._terminate(core, due, meta.get("resourceVersion", ""), elapsed_s=0.0)

    def _gone_with_node(self, core: Any, due: _Due) -> bool:
        if not self._node_lost(core, due):
            return False
        # A lost machine's kubelet reports nothing: the Pod stays Running until the pod
        # garbage collector fails and deletes it (and the Job replaces it).
        with self._cv:
            self.lost += 1
            self._running.discard(due.uid)
            self._batches.pop(due.uid, None)
            self._cv.notify_all()
        log.info("%s/%s on %s: node gone, no result", due.namespace, due.name, due.node)
        return True

    def _write_status(self, core: Any, due: _Due, code: int, message: str, resource_version: str = "") -> bool:
        """Write the Pod's status as a kubelet does once its containers have ended. False
        when the Pod is gone, another Pod by now, or (with ``resource_version``) changed."""
        now = _now_rfc3339()
        names = [name for name, _ in due.containers]
        trial_container = CONTAINER_NAME if CONTAINER_NAME in names else names[0]
        statuses = []
        for name, image in due.containers:
            mine = name == trial_container
            terminated = {
                "exitCode": code if mine else 0,
                "reason": ("Completed" if code == 0 else "Error") if mine else "Completed",
                "startedAt": due.started.get(name) or now,
                "finishedAt": now,
            }
            if mine:
                terminated["message"] = message
            statuses.append({"name": name, "image": image, "imageID": "", "ready": False,
                             "restartCount": 0, "started": False, "state": {"terminated": terminated}})
        phase = "Succeeded" if code == 0 else "Failed"
        condition = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
        # The uid is immutable: a Pod re-created under the same name meanwhile rejects the patch.
        meta = {"uid": due.uid} | ({"resourceVersion": resource_version} if resource_version else {})
        body = {
            "metadata": meta,
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", **condition}, {"type": "ContainersReady", **condition}],
                # containerStatuses has no merge key: this list replaces kwok's `running` one.
                "containerStatuses": statuses,
            },
        }
        try:
            # Raw, and read: the client's model of the returned Pod is slow to build and not needed.
            _ = core.patch_namespaced_pod_status(due.name, due.namespace, body, _request_timeout=10,
                                                 _preload_content=False).data
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return False  # gone, or another Pod (or another state of it) by now
            raise
        return True

    def _answered(self, due: _Due, result: BatchResult, *, killed: bool = False) -> None:
        counts = Counter(Outcome(a.o).value for a in result.answers)
        with self._cv:
            if due.settled:  # a retry that read back what an earlier write stored, or the other path's
                return
            due.settled = True
            self.answered.extend(self._keys(due, result))
            self.outcomes.update(counts)
            if killed:
                self.terminated += 1
            elif not result.done:  # stopped by an infrastructure failure: a verdict on the Pod
                self.outcomes[Outcome.INFRA_ERROR.value] += 1
            self._cv.notify_all()
        synthetic = " (synthetic)" if result.fingerprint.synthetic else ""
        log.info("%s/%s on %s: %s%s%s", due.namespace, due.name, due.node,
                 ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no answer",
                 "" if result.done else f", stopped: {result.error}", synthetic)
