"""Fake Pods' logs: what a batch Pod prints, written where kwok serves it from.

kwok answers the kubelet's log API (which the apiserver proxies `kubectl logs` and the
operator's `pods/log` reads to) from the file a ``Logs`` object (kwok.x-k8s.io) names for
the Pod, in the CRI log format. For each batch Pod it plays, the fleet simulator creates
that object and appends each answer's ``fleettune-answer`` line when its simulated time
comes, as the job image prints it; the operator reads them as it would on a real node.

A cluster without kwok's ``Logs`` CRD (one started before it was installed) serves no
logs: the first refusal turns this off, and the answers come with the Pods' ends only.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from fleettune_job.protocol import CONTAINER_NAME

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kwok.x-k8s.io", "v1alpha1", "logs"


def cri_line(text: str) -> str:
    """One line of the CRI log format kwok reads (plain lines it refuses), stamped now."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} stdout F {text}\n"


class PodLogs:
    """Log files of the simulated Pods, and the lines due in them.

    The files live in a private temporary folder made at ``start`` and removed at ``stop``:
    a simulator built but never started (as unit tests do) leaves nothing behind."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.enabled = True
        self._heap: list[tuple[float, int, str, str]] = []  # (due, seq, Pod uid, line)
        self._paths: dict[str, Path] = {}  # Pod uid -> its file, while lines may still be due
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="fleettune-sim-logs-"))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fleettune-sim-logs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        with self._cv:
            self._paths.clear()
            self._heap.clear()

    def open(self, custom: Any, pod: dict[str, Any]) -> bool:
        """Create the Pod's (empty) log file and the ``Logs`` object pointing kwok at it."""
        if not self.enabled or self.directory is None:  # off, or not started
            return False
        meta = pod["metadata"]
        path = self.directory / f"{meta['namespace']}_{meta['name']}_{meta['uid']}.log"
        path.touch()
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Logs",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "spec": {"logs": [{"containers": [CONTAINER_NAME], "logsFile": str(path), "follow": True}]}}
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, body,
                                                   _request_timeout=10)
        except ApiException as exc:
            if exc.status == 409:  # a Pod of the same name before (a re-created Job): point it here
                custom.patch_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"],
                                                      {"spec": body["spec"]}, _request_timeout=10)
            elif exc.status == 404:
                self.enabled = False
                log.warning("no kwok Logs CRD in this cluster: Pods' logs are not served")
                return False
            else:
                raise
        with self._cv:
            self._paths[meta["uid"]] = path
        return True

    def print_at(self, uid: str, at: float, text: str) -> None:
        """``text`` appears in the Pod's log at monotonic time ``at``."""
        with self._cv:
            if uid in self._paths:
                heapq.heappush(self._heap, (at, next(self._seq), uid, text))
                self._cv.notify_all()

    def close(self, uid: str) -> None:
        """The Pod's container ended: nothing more is printed (a killed batch prints no more)."""
        with self._cv:
            self._paths.pop(uid, None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while not self._stop.is_set() and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cv.wait(min(self._heap[0][0] - time.monotonic(), 1.0) if self._heap else 1.0)
                if self._stop.is_set():
                    return
                _, _, uid, text = heapq.heappop(self._heap)
                path = self._paths.get(uid)
            if path is not None:
                with path.open("a") as f:
                    f.write(cri_line(text))
