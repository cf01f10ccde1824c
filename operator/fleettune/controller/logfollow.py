"""Following running batch Pods' logs for their answers, before the Pods end.

A batch Pod prints one ``fleettune-answer`` line per configuration it measured
(`fleettune_job.protocol.Answer`); its termination message repeats them all when it ends.
Reading the log as it is written lets a run learn (and act on) the first answers while the
Pod still measures the rest.

Contract of `LogFollowers`:

* `LogFollowers.follow` starts reading one Pod's log in a daemon thread of its own and
  returns True; it returns False, starting nothing, when following is off (``slots`` 0),
  when ``slots`` Pods are already followed, or when the Pod was claimed before
  (`StreamedAnswers.claim`: a log is read once). A Pod not followed loses nothing but the
  head start: its answers come with its termination message.
* Each new answer (the first for its index) goes into the shared `StreamedAnswers` under
  the Pod's Job uid, and ``on_answer`` is called after it, from the follower's thread.
* A follower stops when the stream ends (the container did), when `StreamedAnswers.wanted`
  says the Job is deleted or its Pod ended, on a broken connection, or after a log that is
  not there yet was refused FOLLOW_RETRIES times. A stream silent for FOLLOW_IDLE_S is
  opened again while the Pod is wanted (a node may go away without closing it); answers
  read twice are kept once.
* The followers use connections of their own (at most ``slots``): a followed log holds its
  connection for the Pod's life and must not starve the tuning steps' calls.

"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleettune.controller.watch import StreamedAnswers, owning_job_uid
from fleettune.names import bounded
from fleettune_job.protocol import CONTAINER_NAME, MAX_MESSAGE_BYTES, Answer

log = logging.getLogger(__name__)

FOLLOW_ANSWERS_ENV = "FLEETTUNE_FOLLOW_ANSWERS"
DEFAULT_FOLLOW_ANSWERS = 64
# A followed log that says nothing for this long is opened again if its Pod still runs (a
# node may have gone without closing the stream); answers read twice are kept once.
FOLLOW_IDLE_S = 30.0
FOLLOW_RETRIES, FOLLOW_RETRY_S = 20, 0.5  # a log not there yet is asked for again, this often


def follow_answers_from_env() -> int:
    """How many running batch Pods' logs the operator reads at once (0: none; their answers
    then come with their termination messages only)."""
    raw = os.environ.get(FOLLOW_ANSWERS_ENV, "").strip()
    if not raw:
        return DEFAULT_FOLLOW_ANSWERS
    if not raw.isdigit():
        raise ValueError(f"{FOLLOW_ANSWERS_ENV}={raw!r}: expected a whole number of Pods >= 0")
    return int(raw)


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, urllib3.exceptions.ReadTimeoutError | TimeoutError) or "timed out" in str(exc)


class LogFollowers:
    """At most ``slots`` threads, each reading one running batch Pod's log into ``streamed``
    (the module's docstring has the contract)."""

    def __init__(self, api: client.ApiClient, streamed: StreamedAnswers, slots: int) -> None:
        self.api = api
        self.streamed = streamed
        self._slots = slots
        self._free = threading.BoundedSemaphore(slots) if slots > 0 else None

    @cached_property
    def _core(self) -> client.CoreV1Api:
        # Built on first use, from the configuration of the client the operator already has.
        cfg = copy.copy(self.api.configuration)
        cfg.connection_pool_maxsize = self._slots
        return client.CoreV1Api(client.ApiClient(cfg))

    def follow(self, pod: Mapping[str, Any], on_answer: Callable[[], object]) -> bool:
        """Start following ``pod``'s log; False when not started (see the contract)."""
        meta = pod.get("metadata") or {}
        namespace, name, uid, job = meta.get("namespace"), meta.get("name"), meta.get("uid"), owning_job_uid(pod)
        if self._free is None or not (namespace and name and uid and job):
            return False
        if not self._free.acquire(blocking=False):
            return False
        if not self.streamed.claim(uid, namespace, job):
            self._free.release()
            return False
        threading.Thread(target=self._follow, args=(namespace, name, job, on_answer), daemon=True,
                         name=f"fleettune-answers-{name}"[:60]).start()
        return True

    def _follow(self, namespace: str, pod: str, job: str, on_answer: Callable[[], object]) -> None:
        assert self._free is not None
        refused = 0
        try:
            while self.streamed.wanted(namespace, job):
                try:
                    if self._read_answers(namespace, pod, job, on_answer):
                        return  # the stream ended: so did the container
                except ApiException as exc:
                    # 400: no log yet (a container starting; a fake node given its log file
                    # a moment after the Pod ran): ask again shortly. Else, or for too long,
                    # only the head start is lost: the answers come with the termination message.
                    refused += 1
                    if exc.status != 400 or refused > FOLLOW_RETRIES:
                        log.debug("reading the answers of Pod %s/%s: %s", namespace, pod, bounded(str(exc), 300))
                        return
                    time.sleep(FOLLOW_RETRY_S)
                except (OSError, urllib3.exceptions.HTTPError) as exc:
                    if not _timed_out(exc):  # a broken connection: the node or apiserver away
                        log.debug("reading the answers of Pod %s/%s: %s", namespace, pod, bounded(str(exc), 300))
                        return
        finally:
            self._free.release()

    def _read_answers(self, namespace: str, pod: str, job: str, on_answer: Callable[[], object]) -> bool:
        resp: Any = self._core.read_namespaced_pod_log(pod, namespace, container=CONTAINER_NAME, follow=True,
                                                       _preload_content=False, _request_timeout=(10, FOLLOW_IDLE_S))
        try:
            pending = b""
            for chunk in resp.stream(4096, decode_content=True):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    answer = Answer.from_line(line.decode(errors="replace").rstrip("\r"))
                    if answer is not None and self.streamed.add(namespace, job, answer):
                        on_answer()
                if len(pending) > MAX_MESSAGE_BYTES:
                    pending = b""  # no answer is that long: not one of ours
            return True
        finally:
            resp.release_conn()
