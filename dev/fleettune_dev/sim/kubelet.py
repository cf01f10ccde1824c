"""A trial Pod as a kubelet sees it: its answer falling due, and its status once it ended.

:class:`Due` is one Pod the simulator answered: when its answer is due (``at``, on the
monotonic clock), what it answers, and what is needed to write its end. :func:`write_status`
writes a Pod's status the way a kubelet does once its containers have exited: the trial
container ``terminated`` with the exit code and the whole ``BatchResult`` as its message,
phase Succeeded or Failed; a Pod stopped mid-batch exits with :data:`KILLED_EXIT_CODE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiException

from fleettune_dev.sim.batch import BatchAnswer
from fleettune_job.protocol import CONTAINER_NAME, BatchResult

KILLED_EXIT_CODE = 137  # 128 + SIGKILL: what a kubelet reports for a container it stopped


@dataclass(order=True)
class Due:
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


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_status(core: Any, due: Due, code: int, message: str, resource_version: str = "") -> bool:
    """Write the Pod's status as a kubelet does once its containers have ended. False
    when the Pod is gone, another Pod by now, or (with ``resource_version``) changed."""
    now = now_rfc3339()
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
