"""Which watch events wake a run's tuning loop (the kopf layer's only logic; no cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from fleettune.controller import handlers
from fleettune.jobs import MANAGED_BY, RUN_LABEL


@pytest.fixture
def waker() -> Any:
    event = asyncio.Event()
    handlers._wakers["uid-1"] = event
    handlers._run_uids[("ns", "run")] = "uid-1"
    yield event
    handlers._wakers.pop("uid-1", None)
    handlers._run_uids.pop(("ns", "run"), None)
    handlers._runs_seen.pop("uid-1", None)


def _meta(generation: int, annotations: dict[str, str] | None = None) -> kopf.Meta:
    return kopf.Body({"metadata": {"name": "run", "namespace": "ns", "uid": "uid-1", "generation": generation,
                                   "annotations": annotations or {}}}).metadata


def _run_event(meta: kopf.Meta, type: str | None = "MODIFIED") -> None:
    asyncio.run(handlers.run_event(uid="uid-1", name="run", namespace="ns", type=type, meta=meta))


def test_a_run_wakes_for_spec_and_annotation_changes_not_for_its_own_status_writes(waker: Any) -> None:
    _run_event(_meta(1))
    assert waker.is_set()
    waker.clear()
    _run_event(_meta(1))  # the loop's status patch coming back
    assert not waker.is_set()
    _run_event(_meta(2))  # a spec edit
    assert waker.is_set()
    waker.clear()
    _run_event(_meta(2, {"fleettune.dev/retune-requested-at": "t1"}))
    assert waker.is_set()
    waker.clear()
    _run_event(_meta(2, {"fleettune.dev/retune-requested-at": "t1"}), type="DELETED")
    assert waker.is_set() and "uid-1" not in handlers._runs_seen


def _pod(phase: str, exit_code: int | None) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    return {"metadata": {"name": "p", "namespace": "ns", "labels": {MANAGED_BY: "fleettune", RUN_LABEL: "run"},
                         "ownerReferences": [{"kind": "Job", "name": "run-a100-0001", "uid": "job-uid"}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "trial", "state": state}]}}


def test_a_run_wakes_when_one_of_its_trial_pods_ends_decisively(waker: Any) -> None:
    labels = {MANAGED_BY: "fleettune", RUN_LABEL: "run"}
    try:
        for pod, wakes in ((_pod("Running", None), False), (_pod("Failed", 137), False), (_pod("Succeeded", 0), True)):
            asyncio.run(handlers.pod_event(event={"type": "MODIFIED", "object": pod}, namespace="ns", labels=labels))
            assert waker.is_set() == wakes
        assert handlers._ended.get("ns", "job-uid") is not None
    finally:
        handlers._ended.job_deleted("ns", "job-uid")
