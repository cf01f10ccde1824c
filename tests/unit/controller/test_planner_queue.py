"""Trial Jobs behind a Kueue queue, with the planner and a stand-in for Kueue and the Job
controller (tests/unit/controller/fleet_double.py): Jobs are created suspended and labelled for the
queue, a wait is shown apart from running, a long wait says so, and a preempted batch
keeps its answers and hands the rest back. The real Kueue: tests/integration/test_kueue.py."""

from __future__ import annotations

from typing import Any

from fleet_double import FakeFleet
from test_planner import SPEC, timed

from fleettune.jobs import entries_of
from fleettune.labels import QUEUE_NAME_LABEL, QUEUE_PRIORITY_LABEL
from fleettune.metrics import trial_timings


def queued_fleet(queue: dict[str, Any], **budget: Any) -> FakeFleet:
    spec = {**SPEC, "budget": {**SPEC["budget"], **budget}, "queue": queue}
    return FakeFleet(spec=spec, measure=timed)


def condition(f: FakeFleet, kind: str) -> dict[str, Any]:
    assert f.status is not None
    return next(c for c in f.status["conditions"] if c["type"] == kind)


def test_queued_jobs_are_created_suspended_for_their_queue_and_wait_apart_from_running() -> None:
    # One configuration per Job, so that what waits and what runs count Jobs and trials alike.
    f = queued_fleet({"name": "gpu", "priorityClass": "tuning-low"}, parallelism=4, trialsPerPod=1)
    (job,) = f.step().create  # nothing admitted yet: one Job waits, not the pool's parallelism
    labels = job["metadata"]["labels"]
    assert job["spec"]["suspend"] is True
    assert (labels[QUEUE_NAME_LABEL], labels[QUEUE_PRIORITY_LABEL]) == ("gpu", "tuning-low")
    # Kueue reads the Job's labels; its Pods carry only fleettune's.
    assert QUEUE_NAME_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    t = f.target()
    assert (t["queued"], t["podsQueued"], t["running"], t["podsRunning"]) == (1, 1, 0, 0)
    assert "1 queued" in condition(f, "Ready")["message"]
    assert condition(f, "QueueDelayed")["status"] == "False"

    # Waiting is not failing: nothing is recorded, and nothing more piles up in the queue.
    created = f.jobs[job["metadata"]["name"]]["metadata"]["creationTimestamp"]
    f.advance(300)
    plan = f.step()
    assert not plan.create and not plan.records and not f.store.records
    assert f.target()["queuedSince"] == created

    # Admissions open the pool up to its parallelism: 1 admitted -> 1 more may wait, 2 -> 2.
    assert f.admit() == [job["metadata"]["name"]]
    assert len(f.step().create) == 1
    f.admit()
    assert len(f.step().create) == 2
    t = f.target()
    assert (t["queued"], t["running"], t["podsRunning"]) == (2, 2, 2)
    f.admit()
    assert not f.step().create  # parallelism 4 reached
    f.finish()
    f.step()
    assert sum(r.is_observation for r in f.records_of()) == 4 and all(r.is_observation for r in f.records_of())


def test_a_quota_smaller_than_the_parallelism_bounds_what_waits_in_the_queue() -> None:
    f = queued_fleet({"name": "gpu"}, parallelism=8, trialsPerTarget=30)
    f.step()
    most_waiting = 0
    for _ in range(30):
        if len(f.running()) < 2:  # the quota: two Jobs at a time
            f.admit(2 - len(f.running()))
        f.step()
        most_waiting = max(most_waiting, f.target()["podsQueued"])
        f.finish(1)
        f.advance(5)
    assert most_waiting <= 2 and sum(r.is_observation for r in f.records_of()) >= 20


def test_a_pool_waiting_longer_than_max_wait_says_so_until_admitted() -> None:
    f = queued_fleet({"name": "gpu", "maxWaitSeconds": 60})
    f.step()
    f.advance(61)
    f.step()
    delayed = condition(f, "QueueDelayed")
    assert (delayed["status"], delayed["reason"]) == ("True", "QueueWaitExceeded")
    assert "a100: 1 trial Job(s) waiting 61 s for admission by LocalQueue gpu" in delayed["message"]
    assert "LocalQueue gpu" in condition(f, "Ready")["message"]
    f.admit()
    f.step()
    assert condition(f, "QueueDelayed")["status"] == "False"


def test_a_target_queue_overrides_the_runs_and_no_queue_means_no_condition() -> None:
    f = queued_fleet({"name": "gpu"})
    f.spec["targets"] = [{**SPEC["targets"][0], "queue": {"name": "edge-cluster"}}]
    plan = f.step()
    assert {j["metadata"]["labels"][QUEUE_NAME_LABEL] for j in plan.create} == {"edge-cluster"}

    plain = FakeFleet(spec=SPEC, measure=timed)
    plan = plain.step()
    assert all("suspend" not in j["spec"] and QUEUE_NAME_LABEL not in j["metadata"]["labels"] for j in plan.create)
    assert plain.status is not None and not any(c["type"] == "QueueDelayed" for c in plain.status["conditions"])


def test_a_preempted_batch_keeps_its_answers_and_its_unmeasured_configurations_run_next() -> None:
    f = queued_fleet({"name": "gpu"}, parallelism=1, trialsPerPod=4, trialsPerTarget=9)
    f.step()  # the default configuration, alone
    f.admit()
    f.finish()
    plan = f.step()
    (batch,) = plan.create
    entries = [c for _, c in entries_of(batch)]
    assert len(entries) == 4
    f.admit()
    f.preempt(batch["metadata"]["name"], answered=1)

    plan = f.step()
    # The answer it wrote is kept; the three it did not measure are neither failures nor lost.
    assert [r.config for r in plan.records] == entries[:1] and all(r.is_observation for r in f.records_of())
    assert batch["metadata"]["name"] in plan.delete_now
    assert plan.preempted == [(batch["metadata"]["name"], "a100", 1, 3)]
    (again,) = plan.create
    assert [c for _, c in entries_of(again)][:3] == entries[1:]
    assert f.target()["infraFailed"] == 0

    # The run finishes on its budget, each configuration measured once.
    report = f.run()
    records = f.records_of()
    assert report.phase == "Succeeded" and sum(r.is_observation for r in records) == 9
    assert len({r.key for r in records}) == len(records) and not any(not r.is_observation for r in records)


def test_a_preempted_batch_that_answered_nothing_hands_every_configuration_back() -> None:
    f = queued_fleet({"name": "gpu"}, parallelism=1, trialsPerPod=3, trialsPerTarget=7)
    f.step()
    f.admit()
    f.finish()
    (batch,) = f.step().create
    f.admit()
    f.preempt(batch["metadata"]["name"], answered=0)
    plan = f.step()
    assert not plan.records and batch["metadata"]["name"] in plan.delete_now
    (again,) = plan.create
    assert [c for _, c in entries_of(again)] == [c for _, c in entries_of(batch)]
    # A new name: the preempted Job may still be being deleted.
    assert again["metadata"]["name"] != batch["metadata"]["name"]


def test_admission_wait_is_timed_apart_from_the_wait_for_a_node() -> None:
    job = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"conditions": [{"type": "Suspended", "status": "False",
                                      "lastTransitionTime": "2026-01-01T00:05:00Z"}]}}
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                      "lastTransitionTime": "2026-01-01T00:05:02Z"}]}}
    timings = trial_timings(job, [pod])
    assert (timings.admission_wait_s, timings.queue_wait_s) == (300.0, 2.0)
    plain = trial_timings({"metadata": job["metadata"]}, [pod])
    assert (plain.admission_wait_s, plain.queue_wait_s) == (None, 302.0)
