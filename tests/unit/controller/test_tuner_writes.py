"""The shell's writes in one step: a Job is deleted only once its records are durable,
while the next trials need not wait for the store's write (`RunLoop._record_and_launch`);
a busy run's progress is written at most every few seconds, what users and GitOps tools
act on at once (`RunLoop._due`)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from fleettune.controller import tuner
from fleettune.controller.plan import Plan
from fleettune.controller.tuner import STATUS_INTERVAL_S, RunLoop
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome

WAIT_S = 5.0


class Calls:
    """What the fake kube and store were asked, in order, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.created = threading.Event()

    def add(self, what: str) -> None:
        with self.lock:
            self.log.append(what)


class FakeKube:
    core = custom = None

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
        self.calls.add(f"create {body['metadata']['name']}")
        self.calls.created.set()
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        self.calls.add(f"delete {name}")


class SlowStore:
    """A store whose write waits (up to WAIT_S) for a Job to be created: a shell that
    creates only after the write would make it time out."""

    def __init__(self, calls: Calls, fail: bool = False) -> None:
        self.calls, self.fail = calls, fail
        self.saw_create_first = False

    def append(self, records: list[TrialRecord]) -> list[TrialRecord]:
        self.calls.add("store begins")
        self.saw_create_first = self.calls.created.wait(WAIT_S)
        self.calls.add("store ends")
        if self.fail:
            raise RuntimeError("apiserver said no")
        return records

    def take_lost(self) -> list[tuple[str, list[TrialRecord]]]:
        return []


def loop_with(calls: Calls, store: SlowStore) -> RunLoop:
    body = {"metadata": {"name": "r", "namespace": "ns", "uid": "u-1"}, "spec": {}}
    loop = RunLoop(FakeKube(calls), body, logging.getLogger("test"))  # type: ignore[arg-type]
    loop.store = store  # type: ignore[assignment]
    return loop


def plan(delete_now: list[str]) -> Plan:
    rec = TrialRecord(target="a100", index=0, config={"x": 1}, key="x=1", outcome=Outcome.OK, objective=1.0,
                      job="t-0000")
    return Plan(records=[rec], delete_now=delete_now, create=[{"metadata": {"name": "t-0001"}}],
                delete_after=["t-0000"])


def test_the_next_trials_do_not_wait_for_the_store() -> None:
    calls = Calls()
    store = SlowStore(calls)
    asyncio.run(loop_with(calls, store)._record_and_launch(plan([])))
    assert store.saw_create_first, calls.log
    assert calls.log.index("create t-0001") < calls.log.index("store ends")
    assert not any(c.startswith("delete") for c in calls.log)  # delete_after is the caller's, later


def test_a_job_is_deleted_only_after_its_records_are_stored() -> None:
    calls = Calls()
    store = SlowStore(calls)
    asyncio.run(loop_with(calls, store)._record_and_launch(plan(["t-old"])))
    # Something is deleted first: the plain order, store, delete, create.
    assert calls.log == ["store begins", "store ends", "delete t-old", "create t-0001"]
    assert not store.saw_create_first


def test_a_failed_store_write_still_fails_the_step() -> None:
    calls = Calls()
    with pytest.raises(RuntimeError, match="apiserver said no"):
        asyncio.run(loop_with(calls, SlowStore(calls, fail=True))._record_and_launch(plan([])))
    # The new Job exists (adopted by the next step); nothing was deleted.
    assert "create t-0001" in calls.log and not any(c.startswith("delete") for c in calls.log)


def status(phase: str = "Running", ready: str = "True", trials: int = 3, pool: str = "Running") -> dict[str, Any]:
    return {"phase": phase, "observedGeneration": 2, "trials": {"recorded": trials},
            "conditions": [{"type": "Ready", "status": ready, "reason": "Tuning", "message": f"{trials} trials"}],
            "targets": [{"name": "a100", "phase": pool, "trials": trials}]}


def test_progress_is_held_back_what_users_act_on_is_not(monkeypatch) -> None:
    calls = Calls()
    loop = loop_with(calls, SlowStore(calls))
    now = [1000.0]
    monkeypatch.setattr(tuner.time, "monotonic", lambda: now[0])
    assert loop._due(status())  # nothing written yet
    loop.written, loop.written_at = status(), now[0]
    now[0] += 1.0
    assert not loop._due(status(trials=4))  # counters and messages wait
    assert loop._due(status(ready="False", trials=4))  # a condition's status
    assert loop._due(status(pool="Succeeded", trials=4))  # a pool's phase
    assert loop._due(status(phase="Succeeded", trials=4))
    assert loop._due({**status(trials=4), "observedGeneration": 3})  # a new spec seen
    now[0] += STATUS_INTERVAL_S
    assert loop._due(status(trials=9))  # at most STATUS_INTERVAL_S behind
