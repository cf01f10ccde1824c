"""How the simulator ends a trial Pod it answered, as a kubelet would: completed, killed or lost.

:class:`PodEnding` is the part of :class:`~fleettune_dev.sim.simulator.FleetSimulator` that
writes a Pod's end: when its answer falls due (``_complete``), when it is deleted while it
runs (``_terminate``: exit 137 with the answers its simulated time had reached), or when
it is deleted before it was answered (``_stop_untracked``). A Pod whose node is gone gets
no end (``_gone_with_node``: a dead machine's kubelet never reports). A status write whose
reply was lost is read back from the Pod (``_landed``) before anything is written again,
so that every answer is counted once: ``answered``, or ``unsettled`` when the Pod was
deleted before it could be read back. Each ``*_on_worker`` method runs on the
simulator's worker pool and retries (or records) an API failure.

It shares the simulator's state, declared below, under its condition variable ``_cv``.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiException

from fleettune_dev.cluster.fleet import KWOK_ANNOTATION
from fleettune_dev.sim.batch import BatchAnswer
from fleettune_dev.sim.kubelet import KILLED_EXIT_CODE, Due, write_status
from fleettune_dev.sim.podlogs import PodLogs
from fleettune_job.protocol import BatchResult, Fingerprint, Outcome

log = logging.getLogger("fleettune.sim")  # the name in the simulator's log lines


class PodEnding:
    """Ends the trial Pods of a :class:`~fleettune_dev.sim.simulator.FleetSimulator`."""

    # The simulator's state and helpers this part uses (set by FleetSimulator.__init__).
    time_scale: float
    podlogs: PodLogs
    answered: list[tuple[str, str, str, int]]
    unsettled: list[tuple[str, str, str, int]]
    outcomes: Counter[str]
    lost: int
    terminated: int
    _cv: threading.Condition
    _heap: list[Due]
    _running: set[str]
    _batches: dict[str, Due]
    _record_error: Callable[[str], None]
    _worker_api: Callable[[], Any]
    _node_lost: Callable[[Any, Due], bool]
    _due: Callable[..., Due]

    def _complete_on_worker(self, due: Due) -> None:
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

    def _complete(self, core: Any, due: Due) -> None:
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
        if write_status(core, due, result.exit_code, message):
            self._answered(due, result)
        else:
            due.sent = None  # refused: not stored

    def _landed(self, core: Any, due: Due) -> bool:
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
    def _keys(due: Due, result: BatchResult) -> list[tuple[str, str, str, int]]:
        """The trials a result answers: each of its answers."""
        ns, run, target, _ = due.trial
        return [(ns, run, target, a.i) for a in result.answers]

    def _terminate_on_worker(self, due: Due, resource_version: str) -> None:
        try:
            self._terminate(self._worker_api(), due, resource_version)
        except Exception as exc:  # kwok's own stage still ends the Pod (without its answers)
            self._record_error(f"stopping {due.namespace}/{due.name}: {type(exc).__name__}: {exc}")
            if due.sent is not None:  # its answers may have been stored: read the Pod back later
                due.at = time.monotonic() + 1.0
                with self._cv:
                    heapq.heappush(self._heap, due)
                    self._cv.notify_all()

    def _terminate(self, core: Any, due: Due, resource_version: str, elapsed_s: float | None = None) -> None:
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
            if write_status(core, due, code, message, resource_version):
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

    def _gone_with_node(self, core: Any, due: Due) -> bool:
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


    def _answered(self, due: Due, result: BatchResult, *, killed: bool = False) -> None:
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
