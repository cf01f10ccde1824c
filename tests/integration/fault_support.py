"""Fault injection for the integration tier: a stand-in kubelet, extra fake nodes, audits.

The fleet simulator answers every trial Pod on a fake node with a well-formed result. The
fault tests need Pods that answer *badly* (garbled termination messages), Pods that run
long enough to be evicted, and nodes that vanish under a running Pod without the Pod ever
reporting. :class:`PodCompleter` does what a kubelet would for the trial Pods of one
namespace, following a per-trial policy; tests that use it do not start the simulator, so
nobody else answers their Pods. Every trial Pod measures a batch; a policy gets a batch of
one as its one `Trial` (the faults of one configuration are written that way), a larger one
as the `Batch`; `ok_reply`, `ok_batch_reply` and `bad_batch_message` answer them, well or badly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self

import yaml

from fleettune.jobs import entries_of
from fleettune.labels import TARGET_LABEL
from fleettune_dev.cluster.fleet import KWOK_ANNOTATION
from fleettune_job.protocol import (
    CONTAINER_NAME,
    MAX_MESSAGE_BYTES,
    TRIAL_ENV,
    Answer,
    Batch,
    BatchResult,
    Fingerprint,
    Outcome,
    Trial,
)

MANAGED = "app.kubernetes.io/managed-by=fleettune"


KILLED_EXIT_CODE = 137  # what a kubelet reports for a container it stopped
FINGERPRINT = Fingerprint(product="NVIDIA A100-PCIE-40GB", simulated=True)


@dataclass(frozen=True)
class Reply:
    """What the trial container reports: its termination message, exit code, and when
    (``math.inf``: only if its Pod is deleted). ``on_kill``: the message a batch Pod leaves
    when it is deleted before then (its answers so far); without it, an empty one."""

    message: str
    exit_code: int = 0
    delay_s: float = 0.2
    on_kill: str | None = None


def ok_time(config: dict[str, Any]) -> float:
    """A configuration's stable `ok` time (ms): the same in every reply about it."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).digest()
    return round(0.5 + int.from_bytes(digest[:4], "big") / 2**32, 6)


def ok_reply(trial: Trial, delay_s: float = 0.2) -> Reply:
    """A Pod of one configuration that answers it `ok`, with a time that is a stable function
    of the configuration."""
    ms = ok_time(trial.config)
    return Reply(batch_message([Answer(i=trial.index, o=Outcome.OK, t=ms, ts=[ms] * 3)], done=True), 0, delay_s)


def stopped_reply(error: str, delay_s: float = 0.2) -> Reply:
    """A Pod that stopped before its first configuration (an infrastructure failure: exit 20)."""
    return Reply(batch_message([], done=False, error=error), 20, delay_s)


def ok_answers(batch: Batch, answered: int | None = None) -> list[Answer]:
    """`ok` answers, with `ok_reply`'s times, for the first ``answered`` entries (all by default)."""
    entries = batch.entries[:answered] if answered is not None else batch.entries
    return [Answer(i=e.index, o=Outcome.OK, t=ok_time(e.config), ts=[ok_time(e.config)] * 3) for e in entries]


def batch_message(answers: list[Answer], *, done: bool, error: str = "") -> str:
    return BatchResult(answers=answers, fingerprint=FINGERPRINT, done=done, error=error).encode()


def ok_batch_reply(batch: Batch, answered: int | None = None, delay_s: float = 0.2, *,
                   killed_with: int | None = None) -> Reply:
    """A batch Pod that answers its first ``answered`` entries `ok` (all by default; fewer:
    it stops early, exit 20) after ``delay_s``. ``killed_with``: deleted before then, it
    leaves that many answers (exit 137, error "terminated")."""
    n = len(batch.entries) if answered is None else answered
    done = n == len(batch.entries)
    result = BatchResult(answers=ok_answers(batch, n), fingerprint=FINGERPRINT, done=done,
                         error="" if done else "stopped early")
    on_kill = (None if killed_with is None
               else batch_message(ok_answers(batch, killed_with), done=False, error="terminated"))
    return Reply(result.encode(), result.exit_code, delay_s, on_kill)


BadBatch = Literal["oversized", "truncated", "foreign index", "duplicate"]


def bad_batch_message(batch: Batch, kind: BadBatch) -> str:
    """A batch's termination message gone wrong: over 4 KiB; cut short; every entry
    answered plus an answer for an index not in the batch; every entry answered and the
    first answered again (`compile_error`: the first answer must win)."""
    answers = ok_answers(batch)
    if kind == "oversized":
        doc = BatchResult(answers=answers, fingerprint=FINGERPRINT, done=True).model_dump(mode="json")
        doc["error"] = "x" * (MAX_MESSAGE_BYTES + 1)
        return json.dumps(doc)
    if kind == "truncated":
        text = batch_message(answers, done=True)
        return text[: len(text) // 2]
    if kind == "foreign index":
        stray = max(e.index for e in batch.entries) + 1000
        return batch_message([*answers, Answer(i=stray, o=Outcome.OK, t=1.0)], done=True)
    return batch_message([*answers, Answer(i=answers[0].i, o=Outcome.COMPILE_ERROR, e="duplicate")], done=True)


# A policy sees the Pod's work (a batch of one as its Trial, else the Batch) and its Pod;
# None leaves the Pod running (a trial that never ends). Any: policies written for trials
# alone stay valid.
Policy = Callable[[Any, dict[str, Any]], Reply | None]


@dataclass(order=True)
class _Due:
    at: float
    name: str = field(compare=False)
    uid: str = field(compare=False)
    reply: Reply = field(compare=False)
    trial: Trial | Batch = field(compare=False)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _work(pod: dict[str, Any]) -> Trial | Batch:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_NAME)
    batch = Batch.from_env(next(e["value"] for e in container.get("env", []) if e["name"] == TRIAL_ENV))
    return batch.trials()[0] if len(batch.entries) == 1 else batch


def _is_trial_pod(pod: dict[str, Any]) -> bool:
    try:
        _work(pod)
    except (StopIteration, ValueError):  # not a trial Pod this helper can read: kwok ends it
        return False
    return True


def _write_status(core: Any, namespace: str, name: str, image: str, exit_code: int, message: str,
                  metadata: dict[str, str] | None = None) -> None:
    """The Pod's status once its trial container ended, as a kubelet writes it; ``metadata``
    (uid, resourceVersion) makes it conditional."""
    stamp = _now()
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                  "startedAt": stamp, "finishedAt": stamp, "message": message}
    cond = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
    body: dict[str, Any] = {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [{"type": "Ready", **cond}, {"type": "ContainersReady", **cond}],
        "containerStatuses": [{
            "name": CONTAINER_NAME, "image": image, "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": {"terminated": terminated}}],
    }}
    if metadata:
        body["metadata"] = metadata
    core.patch_namespaced_pod_status(name, namespace, body, _request_timeout=10)


class _Poller:
    """A thread that calls `_tick` with an API client every ``poll_s`` seconds while its
    ``with`` block runs. A failed tick is kept in ``errors`` (the last 20) and the polling
    goes on: the fault tests restart the apiserver under it."""

    def __init__(self, cluster: Any, namespace: str, poll_s: float, name: str) -> None:
        self.cluster, self.namespace, self.poll_s = cluster, namespace, poll_s
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)

    def _loop(self) -> None:
        api = self.cluster.api_client()
        try:
            while not self._stop.is_set():
                try:
                    self._tick(api)
                except Exception as exc:
                    self.errors = [*self.errors[-20:], f"{type(exc).__name__}: {exc}"]
                self._stop.wait(self.poll_s)
        finally:
            api.close()

    def _tick(self, api: Any) -> None:
        raise NotImplementedError


class PodCompleter(_Poller):
    """A kubelet stand-in for the trial Pods of one namespace (see the module docstring).

    A Pod is answered only if its node still exists when its reply is due: a machine that
    was deleted reports nothing, which is what the node-loss test needs. A running batch
    Pod that gets a deletionTimestamp is stopped as a kubelet stops it (exit 137, its
    reply's ``on_kill`` message), unless kwok's delete stage ended it first. ``answered``
    lists ``(target, index, pod)`` in completion order (a batch: its first index);
    ``killed`` the batch Pods stopped; ``pods`` keeps every trial Pod seen running, for
    assertions on their spec.
    """

    def __init__(self, cluster: Any, namespace: str, policy: Policy, poll_s: float = 0.2) -> None:
        super().__init__(cluster, namespace, poll_s, "pod-completer")
        self.policy = policy
        self.answered: list[tuple[str, int, str]] = []
        self.killed: list[str] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.running: dict[str, tuple[Trial | Batch, str]] = {}  # pod name -> (work, node) while unanswered
        self._due: list[_Due] = []
        self._seen: set[str] = set()
        self._killed: set[str] = set()
        self._lock = threading.Lock()

    def _tick(self, api: Any) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api)
        self._poll(core)
        self._complete_due(core)

    def _poll(self, core: Any) -> None:
        resp = core.list_namespaced_pod(self.namespace, label_selector=MANAGED, _preload_content=False,
                                        _request_timeout=10)
        for pod in json.loads(resp.data)["items"]:
            meta, status = pod["metadata"], pod.get("status") or {}
            if meta.get("deletionTimestamp") and status.get("phase") == "Running" and meta["uid"] not in self._killed:
                if _is_trial_pod(pod):
                    self._killed.add(meta["uid"])
                    self._kill(core, pod)
                continue
            if (meta["uid"] in self._seen or meta.get("deletionTimestamp") or status.get("phase") != "Running"
                    or not pod["spec"].get("nodeName")):
                continue
            self._seen.add(meta["uid"])
            self.pods[meta["name"]] = pod
            work = _work(pod)
            with self._lock:
                self.running[meta["name"]] = (work, pod["spec"]["nodeName"])
            reply = self.policy(work, pod)
            if reply is not None:
                self._due.append(_Due(time.monotonic() + reply.delay_s, meta["name"], meta["uid"], reply, work))

    def _kill(self, core: Any, pod: dict[str, Any]) -> None:
        """A running batch Pod being deleted: exit 137 with what its reply left by now, over
        the Pod as listed (kwok's delete stage may have ended it meanwhile: then no write)."""
        from kubernetes.client import ApiException

        meta = pod["metadata"]
        due = next((d for d in self._due if d.uid == meta["uid"]), None)
        self._due = [d for d in self._due if d is not due]
        message = (due.reply.on_kill or "") if due is not None else ""
        try:
            _write_status(core, self.namespace, meta["name"], pod["spec"]["containers"][0]["image"], KILLED_EXIT_CODE,
                          message, {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]})
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return
        finally:
            with self._lock:
                self.running.pop(meta["name"], None)
        self.killed.append(meta["name"])

    def _complete_due(self, core: Any) -> None:
        from kubernetes.client import ApiException

        now = time.monotonic()
        ready = sorted(d for d in self._due if d.at <= now)
        self._due = [d for d in self._due if d.at > now]
        for due in ready:
            try:
                pod = core.read_namespaced_pod(due.name, self.namespace, _request_timeout=10)
                core.read_node(pod.spec.node_name, _request_timeout=10)
            except ApiException as exc:
                if exc.status == 404:  # Pod gone, or its machine gone: nothing to report
                    with self._lock:
                        self.running.pop(due.name, None)
                    continue
                raise
            if pod.metadata.uid != due.uid or pod.metadata.deletion_timestamp or pod.status.phase != "Running":
                with self._lock:
                    self.running.pop(due.name, None)
                continue
            _write_status(core, self.namespace, due.name, pod.spec.containers[0].image, due.reply.exit_code,
                          due.reply.message)
            with self._lock:
                self.running.pop(due.name, None)
                first = due.trial.index if isinstance(due.trial, Trial) else due.trial.entries[0].index
                self.answered.append((due.trial.target, first, due.name))

    def wait_running(self, pred: Callable[[Any], bool], timeout: float) -> tuple[str, Any, str]:
        """(pod name, work, node) of an unanswered running trial Pod whose work (a Trial or
        a Batch) matches ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for name, (trial, node) in self.running.items():
                    if pred(trial):
                        return name, trial, node
            time.sleep(0.2)
        raise AssertionError(f"no matching trial Pod ran within {timeout:.0f}s; errors: {self.errors[-3:]}")


# ---------------------------------------------------------------------------- nodes


def add_nodes(cluster: Any, pool: str, names: Iterable[str], labels: dict[str, str]) -> list[str]:
    """Extra fake nodes of ``pool`` (kwok manages them like the fleet's own), with extra labels.

    Tests that delete a node use their own, so the session's fleet stays whole.
    """
    from kubernetes import client

    template = cluster.fleet.pool(pool)
    made = []
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for name in names:
            manifest = template.node_manifest(name)
            manifest["metadata"]["labels"] |= labels | {"kubernetes.io/hostname": name}
            core.create_node(manifest)
            made.append(name)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            nodes = {n.metadata.name: n for n in core.list_node().items if n.metadata.name in made}
            if len(nodes) == len(made) and all(_ready(n) for n in nodes.values()):
                return made
            time.sleep(0.3)
    raise AssertionError(f"extra nodes {made} not Ready")


def _ready(node: Any) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    assert (node.metadata.annotations or {}).get(KWOK_ANNOTATION) == "fake"
    return ready and not [t for t in (node.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]


def delete_nodes(cluster: Any, names: Iterable[str]) -> None:
    for name in names:
        cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


# ---------------------------------------------------------------------------- security


def assert_restricted(pod: dict[str, Any]) -> None:
    """The trial Pod runs as non-root, read-only root filesystem, no escalation, no token."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    assert spec.get("automountServiceAccountToken") is False, "trial pods get no API token"
    assert psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, psc
    for c in spec["containers"]:
        csc = c.get("securityContext") or {}
        assert csc.get("readOnlyRootFilesystem") is True, (c["name"], csc)
        assert csc.get("allowPrivilegeEscalation") is False, (c["name"], csc)
        assert csc.get("privileged") in (None, False), (c["name"], csc)
        assert "ALL" in ((csc.get("capabilities") or {}).get("drop") or []), (c["name"], csc)
        assert not any(m.get("mountPath", "").startswith("/var/run/secrets") for m in c.get("volumeMounts", []))


_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")
_BEARER = re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/=-]{16,}")
_PEM = re.compile(r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----")


def credential_fragments(kubeconfig: Path) -> list[str]:
    """Pieces of the kubeconfig's credentials that must never be echoed anywhere.

    Both the base64 of the kubeconfig fields and the PEM bodies inside them, cut in 32-char
    slices: a leak of any part of a key (a log line cut short, a wrapped PEM) still matches.
    """
    doc = yaml.safe_load(kubeconfig.read_text())
    secrets: list[str] = []
    for user in doc.get("users", []):
        u = user.get("user") or {}
        for key in ("client-key-data", "client-certificate-data", "token"):
            if u.get(key):
                secrets.append(u[key])
                if key.endswith("-data"):
                    pem = base64.b64decode(u[key]).decode()
                    secrets.append("".join(ln for ln in pem.splitlines() if not ln.startswith("-----")))
    return [s[i: i + 32] for s in secrets for i in range(0, max(1, len(s) - 32), 32) if len(s[i: i + 32]) == 32]


def assert_no_secrets(texts: dict[str, str], *kubeconfigs: Path) -> None:
    """No piece of any of these kubeconfigs' credentials, and nothing token-like, in any text."""
    fragments = [f for kc in dict.fromkeys(kubeconfigs) for f in credential_fragments(kc)]
    assert fragments, "the kubeconfigs have credentials to look for"
    for where, text in texts.items():
        leaked = [f for f in fragments if f in text]
        assert not leaked, f"credential material from the kubeconfig appears in {where}"
        for pattern in (_JWT, _BEARER, _PEM):
            m = pattern.search(text)
            assert m is None, f"{where} contains what looks like a credential: {m.group(0)[:24]}..."


# ---------------------------------------------------------------------------- audits


def operator_cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process and its reaped children, from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def tracebacks(log: str) -> list[str]:
    """Each traceback in an operator log, with the line before it (what was being done)."""
    lines = log.splitlines()
    return ["\n".join(lines[max(0, i - 1): i + 12]) for i, ln in enumerate(lines) if ln.startswith("Traceback")]


class JobLedger(_Poller):
    """Every trial Job seen in a namespace, by polling: name -> uids, and creation times.

    A name seen with two uids is a Job that was created twice (a restarted operator that
    did not adopt); the uid set also tells how many distinct Jobs a run really made.
    """

    def __init__(self, cluster: Any, namespace: str, poll_s: float = 0.1) -> None:
        super().__init__(cluster, namespace, poll_s, "job-ledger")
        self.uids: dict[str, set[str]] = {}
        self.created: dict[str, str] = {}  # uid -> creationTimestamp
        self.labels: dict[str, dict[str, str]] = {}  # uid -> labels
        self.trials: dict[str, list[tuple[str, int]]] = {}  # uid -> (pool, index) of each trial it measures
        self.live = 0

    def _tick(self, api: Any) -> None:
        from kubernetes import client

        resp = client.BatchV1Api(api).list_namespaced_job(self.namespace, label_selector=MANAGED,
                                                          _preload_content=False, _request_timeout=10)
        items = json.loads(resp.data)["items"]
        self.live = len(items)
        for job in items:
            meta = job["metadata"]
            self.uids.setdefault(meta["name"], set()).add(meta["uid"])
            self.created.setdefault(meta["uid"], meta["creationTimestamp"])
            self.labels.setdefault(meta["uid"], meta.get("labels", {}))
            if meta["uid"] not in self.trials:
                target = meta.get("labels", {}).get(TARGET_LABEL, "")
                self.trials[meta["uid"]] = [(target, index) for index, _ in entries_of(job)]

    @property
    def total(self) -> int:
        return len(self.created)

    def recreated(self) -> dict[str, int]:
        return {name: len(uids) for name, uids in self.uids.items() if len(uids) > 1}
