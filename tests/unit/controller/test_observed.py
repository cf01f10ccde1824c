"""A trial Job decoded once, as the shell reads it (`fleettune.controller.observed`): what
the planner sees of it is what the dict-reading functions say of the same Job."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fleettune.api import TuningRunSpec
from fleettune.controller.observed import job_gist, parse_job, seen
from fleettune.controller.plan import pods_needed
from fleettune.jobs import entries_of, past_deadline_s, render_job, suspended_since, work_of
from fleettune.labels import ROUND_LABEL
from fleettune.metrics import trial_timings
from fleettune.results import records_from_job
from fleettune_job.protocol import CONTAINER_NAME, Answer, BatchResult, Outcome, TrialResult

ROOT = Path(__file__).resolve().parents[3]
SPEC = TuningRunSpec.model_validate(yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"])
CONFIGS = [({"block_size_x": 32, "block_size_y": 4}, "32,4"), ({"block_size_x": 64, "block_size_y": 2}, "64,2")]


def _job(**status: Any) -> dict[str, Any]:
    body = render_job(run="conv", namespace="ns", uid="uid-1", spec=SPEC, target=SPEC.targets[0], index=7,
                      configs=CONFIGS)
    body["metadata"] |= {"uid": "job-uid", "creationTimestamp": "2026-01-01T00:00:00Z"}
    body["metadata"]["labels"][ROUND_LABEL] = "3"
    body["status"] = status
    return body


def _pod(*answers: Answer, phase: str = "Succeeded") -> dict[str, Any]:
    message = BatchResult(answers=list(answers), done=True).encode()
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "gpu-0"},
            "status": {"phase": phase, "containerStatuses": [{"name": CONTAINER_NAME, "state": {"terminated": {
                "exitCode": 0, "message": message, "startedAt": "2026-01-01T00:00:05Z",
                "finishedAt": "2026-01-01T00:00:09Z"}}}]}}


def _ok(index: int, ms: float) -> Answer:
    return Answer.of(index, TrialResult(outcome=Outcome.OK, objective=ms, times=[ms]))


def test_a_running_job_reads_as_its_dict_says() -> None:
    body = _job(startTime="2026-01-01T00:01:00Z", ready=1)
    job = parse_job(body)
    assert (job.name, job.uid, job.target, job.round) == ("conv-a100-0007", "job-uid", "a100", 3)
    assert list(job.entries) == entries_of(body) and job.keys == ("32,4", "64,2") and job.work == work_of(body)
    assert job.started and not (job.finished or job.suspended or job.preempted or job.earlier_version)
    wall = 1_767_226_000.0
    assert job.past_deadline_s(wall) == past_deadline_s(body, wall) is not None
    assert job.pods is None and job.records is None and job.early == ()
    assert job_gist(body) == (False, False)


def test_a_suspended_job_has_no_deadline_and_waits_since_its_creation() -> None:
    body = _job()
    body["spec"]["suspend"] = True
    job = parse_job(body)
    assert job.suspended and job.preempted and job.past_deadline_s(2e9) is None
    assert job.suspended_since == suspended_since(body) == "2026-01-01T00:00:00Z"


def test_a_finished_jobs_records_and_timings_are_those_of_its_dict_and_pods() -> None:
    body = _job(conditions=[{"type": "Complete", "status": "True"}])
    pods = [_pod(_ok(7, 1.5), _ok(8, 2.5))]
    (job,) = pods_needed([parse_job(body)], {}, set())
    (job,) = seen([job], {}, {job.name: pods}, {})
    assert job.finished and not job.decided and job.pods == tuple(pods)
    expected = records_from_job(body, pods, work_of(body), 3)
    assert job.records is not None
    assert [r.model_dump(exclude={"recorded_at"}) for r in job.records] == [
        r.model_dump(exclude={"recorded_at"}) for r in expected]
    assert job.records is job.records  # derived once
    assert job.timings == trial_timings(body, pods)


def test_a_pod_whose_end_decides_the_job_stands_for_its_pods_and_streamed_answers_are_early() -> None:
    body = _job(ready=1)
    ended = _pod(_ok(7, 1.5), phase="Failed")
    (decided,) = seen([parse_job(body)], {"conv-a100-0007": ended}, {}, {})
    assert decided.decided and decided.pods == (ended,)
    assert pods_needed([decided], {"conv-a100-0007": ended}, set()) == []
    (running,) = seen([parse_job(body)], {}, {}, {"conv-a100-0007": {8: _ok(8, 2.0)}})
    assert [(r.index, r.key, r.objective, r.round) for r in running.early] == [(8, "64,2", 2.0, 3)]


def test_a_rendered_job_parses_unchanged() -> None:
    body = _job()
    before = copy.deepcopy(body)
    parse_job(body)
    assert body == before
