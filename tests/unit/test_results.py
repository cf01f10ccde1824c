from fleettune.labels import CONFIG_ANNOTATION, TARGET_LABEL, TRIAL_LABEL
from fleettune.results import decisive_end, job_finished, record_from_job, result_of_job
from fleettune_job.protocol import EXIT_CODES, Fingerprint, Outcome, TrialResult


def _job(condition=None, reason=""):
    conditions = [{"type": condition, "status": "True", "reason": reason, "message": "m"}] if condition else []
    return {
        "metadata": {
            "name": "run-a100-0003",
            "labels": {TARGET_LABEL: "a100", TRIAL_LABEL: "3"},
            "annotations": {CONFIG_ANNOTATION: "32,4"},
        },
        "status": {"conditions": conditions},
    }


def _pod(message=None, exit_code=0, started=True, finished="2026-01-01T00:00:01Z", node="gpu-0"):
    state = {"terminated": {"exitCode": exit_code, "message": message, "finishedAt": finished}} if started else {}
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node},
        "status": {"containerStatuses": [{"name": "trial", "state": state}]},
    }


def test_unfinished_job_is_not_read():
    assert not job_finished(_job())
    assert job_finished(_job("Complete")) and job_finished(_job("Failed", "PodFailurePolicy"))


def test_ok_result_becomes_a_valid_record_with_its_fingerprint():
    msg = TrialResult(outcome=Outcome.OK, objective=0.5, times=[0.5], fingerprint=Fingerprint(product="A100")).encode()
    rec = record_from_job(_job("Complete"), [_pod(msg)], {"block_size_x": 32}, 1)
    assert rec.outcome == Outcome.OK and rec.objective == 0.5 and rec.is_observation
    assert (rec.target, rec.index, rec.key, rec.node) == ("a100", 3, "32,4", "gpu-0")
    assert rec.fingerprint.product == "A100"


def test_invalid_configuration_is_an_observation():
    msg = TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many resources").encode()
    res = result_of_job(_job("Failed", "PodFailurePolicy"), [_pod(msg, EXIT_CODES[Outcome.COMPILE_ERROR])])
    assert res.outcome == Outcome.COMPILE_ERROR and "resources" in res.error


def test_garbled_or_missing_message_is_an_infrastructure_failure_with_the_text():
    for message in (None, "", "{not json", '{"version": 7}'):
        res = result_of_job(_job("Complete"), [_pod(message)])
        assert res.outcome == Outcome.INFRA_ERROR and res.error


def test_exit_code_that_contradicts_the_message_is_not_trusted():
    msg = TrialResult(outcome=Outcome.OK, objective=1.0).encode()
    res = result_of_job(_job("Failed", "PodFailurePolicy"), [_pod(msg, exit_code=12)])
    assert res.outcome == Outcome.INFRA_ERROR and "contradicts" in res.error


def test_deadline_separates_slow_configurations_from_pods_that_never_ran():
    ran = result_of_job(_job("Failed", "DeadlineExceeded"), [_pod(None, exit_code=137)])
    assert ran.outcome == Outcome.TIMEOUT
    never = result_of_job(_job("Failed", "DeadlineExceeded"), [_pod(started=False)])
    assert never.outcome == Outcome.INFRA_ERROR and "never started" in never.error


def test_last_pod_wins_after_retries():
    first = _pod(TrialResult(outcome=Outcome.INFRA_ERROR, error="no gpu").encode(), 20, finished="2026-01-01T00:00:01Z")
    second = _pod(TrialResult(outcome=Outcome.OK, objective=2.0).encode(), 0, finished="2026-01-01T00:00:09Z")
    assert result_of_job(_job("Complete"), [second, first]).objective == 2.0


def test_job_without_pods_left_is_an_infrastructure_failure():
    res = result_of_job(_job("Complete"), [])
    assert res.outcome == Outcome.INFRA_ERROR and "no trial pod" in res.error


def _ended(exit_code, phase):
    pod = _pod(TrialResult(outcome=Outcome.OK, objective=1.0).encode(), exit_code)
    pod["status"]["phase"] = phase
    return pod


def test_a_pod_end_decides_its_job_only_when_the_job_cannot_retry_it():
    assert decisive_end(_ended(0, "Succeeded"))  # the one completion the Job needs
    for outcome in (Outcome.COMPILE_ERROR, Outcome.LAUNCH_ERROR, Outcome.RUNTIME_ERROR, Outcome.CORRECTNESS_ERROR,
                    Outcome.TIMEOUT):
        assert decisive_end(_ended(EXIT_CODES[outcome], "Failed")), outcome  # podFailurePolicy FailJob
    # An infrastructure failure or a kill may be retried by the Job: wait for its condition.
    for code in (EXIT_CODES[Outcome.INFRA_ERROR], 137, 1):
        assert not decisive_end(_ended(code, "Failed")), code
    # Not yet terminal (its GPU is not free yet), or not terminated at all.
    assert not decisive_end(_ended(0, "Running"))
    running = _pod(started=False)
    running["status"]["phase"] = "Running"
    assert not decisive_end(running)


def test_a_decisive_pod_gives_the_record_the_completed_job_would():
    msg = TrialResult(outcome=Outcome.OK, objective=0.5, times=[0.5]).encode()
    pod = _pod(msg)
    early = record_from_job(_job(), [pod], {"block_size_x": 32}, 1)
    late = record_from_job(_job("Complete"), [pod], {"block_size_x": 32}, 1)
    assert early.model_dump(exclude={"recorded_at"}) == late.model_dump(exclude={"recorded_at"})
    assert early.outcome == Outcome.OK and early.objective == 0.5
