"""A trial Job's Pods into its records: when a Pod's end decides the Job, and a batch of
one read as a batch (its invalid configuration an observation, its disruption no verdict)."""

import json

from fleettune.labels import CONFIG_KEYS_ANNOTATION, TARGET_LABEL, TRIAL_LABEL
from fleettune.results import decisive_end, disrupted, job_finished, records_from_job
from fleettune_job.protocol import (
    EXIT_ANSWERED,
    EXIT_STOPPED_EARLY,
    Answer,
    Batch,
    BatchResult,
    Entry,
    Fingerprint,
    KernelRef,
    Outcome,
    TrialResult,
)

ONE = Batch(run="run", target="a100", kernel=KernelRef(builtin="convolution"), problem_size=[64, 64],
            entries=[Entry(index=3, config={"block_size_x": 32})])


def _job(condition=None, reason=""):
    conditions = [{"type": condition, "status": "True", "reason": reason, "message": "m"}] if condition else []
    return {
        "metadata": {
            "name": "run-a100-0003",
            "labels": {TARGET_LABEL: "a100", TRIAL_LABEL: "3"},
            "annotations": {CONFIG_KEYS_ANNOTATION: json.dumps(["32,4"])},
        },
        "status": {"conditions": conditions},
    }


def _pod(message=None, exit_code=0, started=True, phase="Succeeded", conditions=()):
    state = {"terminated": {"exitCode": exit_code, "message": message, "finishedAt": "2026-01-01T00:00:01Z"}} \
        if started else {}
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "gpu-0"},
        "status": {"phase": phase, "conditions": list(conditions),
                   "containerStatuses": [{"name": "trial", "state": state}]},
    }


def _answered(result: TrialResult) -> str:
    return BatchResult(answers=[Answer.of(3, result)], fingerprint=Fingerprint(product="A100"), done=True).encode()


DISRUPTED = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}


def test_unfinished_job_is_not_read():
    assert not job_finished(_job())
    assert job_finished(_job("Complete")) and job_finished(_job("Failed", "BackoffLimitExceeded"))


def test_any_end_of_a_trial_pod_decides_its_job_but_a_disruption():
    invalid = _answered(TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many registers"))
    assert decisive_end(_pod(invalid, EXIT_ANSWERED))  # an invalid configuration is an answer: Job done
    # Stopped early or killed: the Job is never retried (backoffLimit 0), so this is its end.
    for code in (EXIT_STOPPED_EARLY, 137, 1):
        assert decisive_end(_pod(None, code, phase="Failed")), code
    # Preempted, evicted, drained, its node lost: the Job ignores that end and starts another Pod.
    gone = _pod(None, 137, phase="Failed", conditions=[DISRUPTED])
    assert disrupted(gone) and not decisive_end(gone)
    assert not disrupted(_pod(None, 137, phase="Failed", conditions=[DISRUPTED | {"status": "False"}]))
    # Not yet terminal (its GPU is not free yet), or not terminated at all.
    assert not decisive_end(_pod(invalid, 0, phase="Running"))
    assert not decisive_end(_pod(started=False, phase="Running"))


def test_a_batch_of_one_records_an_invalid_configuration_as_an_observation():
    msg = _answered(TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many resources"))
    (rec,) = records_from_job(_job("Complete"), [_pod(msg)], ONE, 1)
    assert rec.outcome == Outcome.COMPILE_ERROR and "resources" in rec.error and rec.is_observation
    assert (rec.target, rec.index, rec.key, rec.node, rec.config) == ("a100", 3, "32,4", "gpu-0", {"block_size_x": 32})


def test_a_batch_of_one_that_answered_nothing_is_not_measured_never_invalid():
    for message in (None, "", "{not json", '{"version": 7}', BatchResult(error="no GPU").encode()):
        (rec,) = records_from_job(_job("Failed", "BackoffLimitExceeded"), [_pod(message, 20, phase="Failed")], ONE, 1)
        assert rec.outcome == Outcome.INFRA_ERROR and "not measured" in rec.error and not rec.is_observation


def test_a_decisive_pod_gives_the_records_the_completed_job_would():
    pod = _pod(_answered(TrialResult(outcome=Outcome.OK, objective=0.5, times=[0.5])))
    early = records_from_job(_job(), [pod], ONE, 1)
    late = records_from_job(_job("Complete"), [pod], ONE, 1)
    assert [r.model_dump(exclude={"recorded_at"}) for r in early] == [r.model_dump(exclude={"recorded_at"})
                                                                       for r in late]
    assert early[0].outcome == Outcome.OK and early[0].objective == 0.5 and early[0].fingerprint.product == "A100"


def test_a_pod_that_stopped_early_reads_the_same_before_and_after_its_job_failed():
    # The Pod's own reason, not the Job's end: one text (one Event series) however it is read.
    pod = _pod(BatchResult(error="CUDA driver version is insufficient").encode(), EXIT_STOPPED_EARLY, phase="Failed")
    (early,) = records_from_job(_job(), [pod], ONE, 1)
    (late,) = records_from_job(_job("Failed", "BackoffLimitExceeded"), [pod], ONE, 1)
    assert early.error == late.error == "not measured: the batch ended before this configuration " \
                                        "(CUDA driver version is insufficient)"
