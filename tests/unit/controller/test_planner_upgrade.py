"""A one-configuration trial Job of an operator before every Job was a batch, found after an
upgrade: its protocol is no longer read, so it is deleted and its configuration measured
again in a batch Job, first; nothing of it is recorded, nothing lost
(tests/unit/controller/fleet_double.py plays the cluster)."""

from __future__ import annotations

from typing import Any

from fleet_double import FakeFleet
from test_planner import SPEC, timed

from fleettune.jobs import entries_of, from_earlier_version, work_of
from fleettune.labels import BATCH_LABEL


def as_earlier_version(job: dict[str, Any]) -> None:
    """Rewrite a batch of one as the operator of an earlier version rendered its Job: a
    `Trial` document and no batch label."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    (trial,) = work_of(job).trials()
    for env in container["env"]:
        if env["name"] == "FLEETTUNE_TRIAL":
            env["value"] = trial.model_dump_json(exclude_none=True)
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        labels.pop(BATCH_LABEL, None)


def test_a_job_of_an_earlier_version_is_deleted_and_its_configuration_measured_again_first() -> None:
    f = FakeFleet(spec={**SPEC, "budget": {**SPEC["budget"], "parallelism": 2, "trialsPerPod": 1}}, measure=timed)
    created = f.step().create
    old, kept = created[0], created[1]
    name, [(index, config)] = old["metadata"]["name"], entries_of(old)
    as_earlier_version(f.jobs[name])
    assert from_earlier_version(f.jobs[name]) and entries_of(f.jobs[name]) == [(index, config)]

    plan = f.step()
    assert plan.delete_now == [name] and plan.superseded == [(name, "a100", 1)] and not plan.records
    (again,) = plan.create  # one slot free: the handed-back configuration takes it
    assert [c for _, c in entries_of(again)] == [config] and entries_of(again)[0][0] != index
    assert not from_earlier_version(again) and kept["metadata"]["name"] in f.jobs

    # Finished before the upgrade and not recorded: the same, its answer is not read.
    report = f.run()
    records = f.records_of()
    assert report.phase == "Succeeded" and sum(r.is_observation for r in records) == SPEC["budget"]["trialsPerTarget"]
    assert index not in {r.index for r in records}  # nothing recorded of the old Job
    assert [r.config for r in records].count(config) == 1 and f.target()["infraFailed"] == 0


def test_a_finished_job_of_an_earlier_version_is_not_read_either() -> None:
    f = FakeFleet(spec={**SPEC, "budget": {**SPEC["budget"], "parallelism": 1, "trialsPerPod": 1}}, measure=timed)
    (old,) = f.step().create
    name, [(_, config)] = old["metadata"]["name"], entries_of(old)
    f.finish()
    as_earlier_version(f.jobs[name])
    plan = f.step()
    assert name in plan.delete_now and not plan.records and plan.superseded == [(name, "a100", 1)]
    assert [c for _, c in entries_of(plan.create[0])] == [config]
