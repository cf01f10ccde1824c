"""Which watch events wake a run's tuning loop (the kopf layer's only logic; no cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from fleettune.controller import handlers, logfollow
from fleettune.controller.handlers import OperatorState
from fleettune.labels import BATCH_LABEL, MANAGED_BY, RUN_LABEL


@pytest.fixture
def memo() -> kopf.Memo:
    return kopf.Memo(fleettune=OperatorState())


@pytest.fixture
def waker(memo: kopf.Memo) -> Any:
    event = asyncio.Event()
    memo.fleettune.wakers["uid-1"] = event
    memo.fleettune.run_uids[("ns", "run")] = "uid-1"
    return event


def _meta(generation: int, annotations: dict[str, str] | None = None) -> kopf.Meta:
    return kopf.Body({"metadata": {"name": "run", "namespace": "ns", "uid": "uid-1", "generation": generation,
                                   "annotations": annotations or {}}}).metadata


def _run_event(memo: kopf.Memo, meta: kopf.Meta, type: str | None = "MODIFIED") -> None:
    asyncio.run(handlers.run_event(uid="uid-1", name="run", namespace="ns", type=type, meta=meta, memo=memo))


def test_a_run_wakes_for_spec_and_annotation_changes_not_for_its_own_status_writes(waker: Any, memo: kopf.Memo) -> None:
    _run_event(memo, _meta(1))
    assert waker.is_set()
    waker.clear()
    _run_event(memo, _meta(1))  # the loop's status patch coming back
    assert not waker.is_set()
    _run_event(memo, _meta(2))  # a spec edit
    assert waker.is_set()
    waker.clear()
    _run_event(memo, _meta(2, {"fleettune.dev/retune-requested-at": "t1"}))
    assert waker.is_set()
    waker.clear()
    _run_event(memo, _meta(2, {"fleettune.dev/retune-requested-at": "t1"}), type="DELETED")
    assert waker.is_set() and "uid-1" not in memo.fleettune.runs_seen


def _pod(phase: str, exit_code: int | None, disrupted: bool = False) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    return {"metadata": {"name": "p", "namespace": "ns", "labels": {MANAGED_BY: "fleettune", RUN_LABEL: "run"},
                         "ownerReferences": [{"kind": "Job", "name": "run-a100-0001", "uid": "job-uid"}]},
            "status": {"phase": phase, "conditions": conditions,
                       "containerStatuses": [{"name": "trial", "state": state}]}}


def test_a_run_wakes_when_one_of_its_trial_pods_ends_decisively(waker: Any, memo: kopf.Memo) -> None:
    labels = {MANAGED_BY: "fleettune", RUN_LABEL: "run"}
    for pod, wakes in ((_pod("Running", None), False), (_pod("Failed", 137, disrupted=True), False),
                       (_pod("Succeeded", 0), True)):
        asyncio.run(handlers.pod_event(event={"type": "MODIFIED", "object": pod}, namespace="ns", labels=labels,
                                       memo=memo))
        assert waker.is_set() == wakes
    assert memo.fleettune.ended.get("ns", "job-uid") is not None


@pytest.mark.parametrize(("raw", "expected"), [("", 600.0), ("0", 0.0), ("1800", 1800.0)])
def test_the_node_wait_comes_from_the_operators_environment(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                           expected: float) -> None:
    monkeypatch.setenv(handlers.NODE_WAIT_ENV, raw)
    assert handlers.node_wait_from_env() == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "nan", "inf"])
def test_a_bad_node_wait_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(handlers.NODE_WAIT_ENV, raw)
    with pytest.raises(ValueError, match=f"^{handlers.NODE_WAIT_ENV}="):
        handlers.node_wait_from_env()


@pytest.mark.parametrize(("raw", "expected"), [("", 2), ("1", 1), ("4", 4)])
def test_the_model_threads_come_from_the_operators_environment(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                               expected: int) -> None:
    monkeypatch.setenv(handlers.MODEL_THREADS_ENV, raw)
    assert handlers.model_threads_from_env() == expected


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5"])
def test_bad_model_threads_are_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(handlers.MODEL_THREADS_ENV, raw)
    with pytest.raises(ValueError, match=f"^{handlers.MODEL_THREADS_ENV}="):
        handlers.model_threads_from_env()


def _job(rv: int, *, complete: bool = False, suspend: bool = False, active: int = 0) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    return {"metadata": {"name": "run-a100-0001", "namespace": "ns", "uid": "job-uid", "resourceVersion": str(rv),
                         "labels": {MANAGED_BY: "fleettune", RUN_LABEL: "run"},
                         "ownerReferences": [{"kind": "TuningRun", "name": "run", "uid": "uid-1"}]},
            "spec": {"suspend": suspend}, "status": {"active": active, "conditions": conditions}}


def _job_event(memo: kopf.Memo, type: str, job: dict[str, Any]) -> None:
    asyncio.run(handlers.job_event(event={"type": type, "object": job}, body=kopf.Body(job), memo=memo))


def test_a_run_wakes_for_what_its_step_acts_on_in_a_job_not_for_every_update(waker: Any, memo: kopf.Memo) -> None:
    state = memo.fleettune
    steps = [
        ("ADDED", _job(1, suspend=True), True),  # a Job the operator has not seen: a step adopts it
        ("MODIFIED", _job(2), True),  # its queue admitted it
        ("MODIFIED", _job(3, active=1), False),  # its Pod started: nothing to decide
        ("MODIFIED", _job(3, active=1), False),
        ("MODIFIED", _job(4, complete=True), True),  # finished: record it
        ("DELETED", _job(5, complete=True), True),  # deleted by someone else: its work is gone
    ]
    for type_, job, wakes in steps:
        _job_event(memo, type_, job)
        assert waker.is_set() == wakes, (type_, job)
        waker.clear()
    # The operator's own Job (entered as it is created), and its last events once it deleted it.
    state.jobs.created({**_job(10), "metadata": {**_job(10)["metadata"], "uid": "job-2"}})
    ours = {**_job(11), "metadata": {**_job(11)["metadata"], "uid": "job-2"}}
    _job_event(memo, "ADDED", ours)
    assert not waker.is_set()
    state.jobs.deleted("ns", "run-a100-0001")
    for type_ in ("MODIFIED", "DELETED"):
        _job_event(memo, type_, {**ours, "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
        assert not waker.is_set()


class _Following:
    """The part of `Kube` the Pod handler uses to read a Pod's answers."""

    def __init__(self) -> None:
        self.pods: list[str] = []
        self.wakes: list[Any] = []

    def follow_answers(self, pod: dict[str, Any], on_answer: Any) -> bool:
        self.pods.append(pod["metadata"]["name"])
        self.wakes.append(on_answer)
        return True


def test_a_running_batch_pods_answers_are_read_and_wake_its_run(waker: Any, memo: kopf.Memo) -> None:
    following = _Following()
    memo.fleettune._kube = following
    labels = {MANAGED_BY: "fleettune", RUN_LABEL: "run", BATCH_LABEL: "true"}

    async def play() -> None:
        for pod in (_pod("Running", None), _pod("Pending", None)):
            pod["metadata"]["labels"] = labels
            await handlers.pod_event(event={"type": "MODIFIED", "object": pod}, namespace="ns", labels=labels,
                                     memo=memo)
        assert following.pods == ["p"] and not waker.is_set()  # only the running container's log
        following.wakes[0]()  # an answer read, in the reader's thread
        await asyncio.wait_for(waker.wait(), 1.0)
        ended = _pod("Failed", 137)
        ended["metadata"]["labels"] = labels
        await handlers.pod_event(event={"type": "MODIFIED", "object": ended}, namespace="ns", labels=labels,
                                 memo=memo)
        assert not memo.fleettune.streamed.wanted("ns", "job-uid")  # its log says no more

    asyncio.run(play())


@pytest.mark.parametrize(("raw", "expected"), [("", 64), ("0", 0), ("8", 8)])
def test_how_many_logs_are_read_comes_from_the_operators_environment(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                                     expected: int) -> None:
    monkeypatch.setenv(logfollow.FOLLOW_ANSWERS_ENV, raw)
    assert logfollow.follow_answers_from_env() == expected


@pytest.mark.parametrize("raw", ["-1", "many", "2.5"])
def test_a_bad_number_of_logs_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(logfollow.FOLLOW_ANSWERS_ENV, raw)
    with pytest.raises(ValueError, match=f"^{logfollow.FOLLOW_ANSWERS_ENV}="):
        logfollow.follow_answers_from_env()
