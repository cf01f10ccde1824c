"""A trial Job the Job controller lost track of (`jobs.STALL_GRACE_S`): deleted well past its
deadline, what its Pod answered kept, the rest measured again, nothing recorded as failed
(tests/unit/controller/fleet_double.py plays the cluster; a Job it never finishes stands for one whose
Pod is gone and whose controller never starts another)."""

from __future__ import annotations

from typing import Any

from fleet_double import FakeFleet, iso
from test_planner import SPEC, timed
from test_planner_batches import batch_running, fleet
from test_planner_queue import queued_fleet

from fleettune.jobs import STALL_GRACE_S, entries_of, past_deadline_s


def deadline(job: dict[str, Any]) -> int:
    return int(job["spec"]["activeDeadlineSeconds"])


def test_a_job_past_its_deadline_and_the_grace_is_replaced_and_its_configuration_measured_again() -> None:
    f = FakeFleet(spec={**SPEC, "budget": {**SPEC["budget"], "parallelism": 1, "trialsPerPod": 1}}, measure=timed)
    (lost,) = f.step().create
    name, (_, config) = lost["metadata"]["name"], entries_of(lost)[0]

    # Up to the grace, the Job controller may still end it: it keeps running.
    f.advance(deadline(lost) + STALL_GRACE_S - 1)
    plan = f.step()
    assert not plan.delete_now and not plan.create and not plan.stalled

    f.advance(2)
    plan = f.step()
    assert plan.delete_now == [name] and not plan.records
    assert plan.stalled == [(name, "a100", STALL_GRACE_S + 1, 0, 1)]
    (again,) = plan.create
    assert again["metadata"]["name"] != name and [c for _, c in entries_of(again)] == [config]
    (kind, reason, message) = f.planner.events[-1]
    assert (kind, reason) == ("Warning", "TrialJobStalled")
    assert f"trial Job {name} still runs {STALL_GRACE_S + 1} s after its deadline" in message
    assert f.target()["infraFailed"] == 0

    # The run ends on its budget with every configuration measured once, none failed by the loss.
    report = f.run()
    records = f.records_of()
    assert report.phase == "Succeeded" and sum(r.is_observation for r in records) == SPEC["budget"]["trialsPerTarget"]
    assert len({r.key for r in records}) == len(records) and all(r.is_observation for r in records)


def test_a_stalled_batch_keeps_the_answers_its_pod_printed_and_hands_the_rest_back() -> None:
    f = fleet(trialsPerTarget=20, parallelism=1, trialsPerPod=5)
    job = batch_running(f)
    name, batch = job["metadata"]["name"], entries_of(job)
    f.print_answers(name, 2)
    f.advance(deadline(f.jobs[name]) + STALL_GRACE_S + 1)
    plan = f.step()
    assert name in plan.delete_now and plan.stalled[0][3:] == (2, 3)
    assert sorted(r.index for r in plan.records) == [i for i, _ in batch[:2]]
    assert [r.objective for r in plan.records] == [timed(c).objective for _, c in batch[:2]]
    (again,) = plan.create
    assert [c for _, c in entries_of(again)][:3] == [c for _, c in batch[2:]]


def test_a_job_waiting_in_its_queue_is_never_stalled() -> None:
    f = queued_fleet({"name": "gpu"})
    (job,) = f.step().create
    f.advance(10 * (deadline(job) + STALL_GRACE_S))
    plan = f.step()
    assert not plan.delete_now and not plan.stalled and not plan.create


def test_the_deadline_counts_from_the_jobs_start_once_it_has_one() -> None:
    # Admitted by its queue an hour after its creation: the deadline runs from the admission.
    now = 1_000_000.0
    job = {"metadata": {"creationTimestamp": iso(now - 3600)}, "spec": {"activeDeadlineSeconds": 100},
           "status": {"startTime": iso(now - 100)}}
    assert past_deadline_s(job, now) == 0
    assert past_deadline_s(job, now + 5) == 5
    # Never synced by the Job controller (no start): from its creation.
    del job["status"]
    assert past_deadline_s(job, now) == 3600 - 100
    assert past_deadline_s({**job, "spec": {**job["spec"], "suspend": True}}, now) is None
    assert past_deadline_s({**job, "spec": {}}, now) is None
