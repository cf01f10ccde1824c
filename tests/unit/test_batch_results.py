"""A trial Job's Pods into one record per configuration: nothing lost, nothing counted
twice, nothing recorded as invalid that was not measured invalid."""

import json

import pytest

from fleettune.labels import CONFIG_KEYS_ANNOTATION, TARGET_LABEL, TRIAL_LABEL
from fleettune.results import records_from_job
from fleettune_job.protocol import (
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    Answer,
    Batch,
    BatchResult,
    Entry,
    Fingerprint,
    KernelRef,
    Outcome,
    ProtocolError,
    TrialResult,
    decode_batch,
)

BATCH = Batch(run="run", target="a100", kernel=KernelRef(builtin="gemm"), problem_size=[64, 64],
              entries=[Entry(index=10 + n, config={"x": n}) for n in range(4)])
FP = Fingerprint(product="NVIDIA A100-PCIE-40GB", compute_capability="8.0")


def _job(condition=None, reason=""):
    conditions = [{"type": condition, "status": "True", "reason": reason, "message": "m"}] if condition else []
    return {"metadata": {"name": "run-a100-0010", "labels": {TARGET_LABEL: "a100", TRIAL_LABEL: "10"},
                         "annotations": {CONFIG_KEYS_ANNOTATION: json.dumps(["k0", "k1", "k2", "k3"])}},
            "status": {"conditions": conditions}}


def _pod(message, exit_code=0, finished="2026-01-01T00:00:10Z", node="gpu-0"):
    return {"metadata": {"name": f"p-{finished}"}, "spec": {"nodeName": node},
            "status": {"containerStatuses": [{"name": "trial", "state": {"terminated": {
                "exitCode": exit_code, "message": message, "finishedAt": finished}}}]}}


def _ok(index, ms=1.0):
    return Answer.of(index, TrialResult(outcome=Outcome.OK, objective=ms, times=[ms], run_s=0.2, compile_s=1.5))


def _message(*answers, done=False, error=""):
    return BatchResult(answers=list(answers), fingerprint=FP, done=done, error=error).encode()


def test_every_answer_becomes_a_record_in_entry_order():
    pruned = Answer.of(13, TrialResult(outcome=Outcome.OK, objective=9.0, times=[9.0] * 3, pruned=True))
    answers = [_ok(10), Answer(i=11, o=Outcome.COMPILE_ERROR, e="ptxas: too many registers"), _ok(12, 2.0), pruned]
    recs = records_from_job(_job("Complete"), [_pod(_message(*answers, done=True))], BATCH, 2)
    assert [(r.index, r.outcome, r.key, r.config) for r in recs] == [
        (10, Outcome.OK, "k0", {"x": 0}), (11, Outcome.COMPILE_ERROR, "k1", {"x": 1}),
        (12, Outcome.OK, "k2", {"x": 2}), (13, Outcome.OK, "k3", {"x": 3})]
    assert recs[2].objective == 2.0 and recs[0].run_s == 0.2 and recs[0].compile_s == 1.5
    assert all(r.round == 2 and r.node == "gpu-0" and r.fingerprint.product == FP.product for r in recs)
    assert recs[1].is_observation and not recs[1].objective  # an invalid configuration, as measured
    assert [r.pruned for r in recs] == [None, None, None, True]  # a valid one, timed no further than needed


def test_a_pod_killed_mid_batch_keeps_what_it_finished_and_loses_nothing_as_invalid():
    message = _message(_ok(10), Answer(i=11, o=Outcome.TIMEOUT, e="no result within 60 s"),
                       error="terminated by SIGTERM")
    recs = records_from_job(_job("Failed", "BackoffLimitExceeded"), [_pod(message, 137)], BATCH, 1)
    assert [r.outcome for r in recs] == [Outcome.OK, Outcome.TIMEOUT, Outcome.INFRA_ERROR, Outcome.INFRA_ERROR]
    assert "not measured" in recs[2].error and "SIGTERM" in recs[2].error
    assert not recs[2].is_observation and not recs[3].is_observation


@pytest.mark.parametrize("message", [
    None, "", "{not json", json.dumps({"version": 1, "batch": True, "answers": [{"i": 10, "o": "ok"}]}),
    json.dumps({"version": 2, "batch": True}), "x" * (MAX_MESSAGE_BYTES + 1),
    _message(_ok(10))[:-7],  # cut off, as a kubelet cuts an oversized message
])
def test_an_unreadable_message_leaves_every_entry_unmeasured(message):
    recs = records_from_job(_job("Failed"), [_pod(message, 1)], BATCH, 1)
    assert [r.outcome for r in recs] == [Outcome.INFRA_ERROR] * 4


def test_answers_for_other_indexes_are_ignored_and_the_first_answer_wins():
    first = _pod(_message(_ok(10, 1.0), _ok(99, 0.001), _ok(10, 5.0)), 137, finished="2026-01-01T00:00:05Z")
    second = _pod(_message(_ok(10, 3.0), _ok(11, 4.0), _ok(12), _ok(13), done=True), finished="2026-01-01T00:00:20Z",
                  node="gpu-1")
    recs = records_from_job(_job("Complete"), [second, first], BATCH, 1)
    assert [r.index for r in recs] == [10, 11, 12, 13]  # nothing for index 99, nothing twice
    assert recs[0].objective == 1.0 and recs[0].node == "gpu-0"  # the earlier Pod's measurement
    assert recs[1].objective == 4.0 and recs[1].node == "gpu-1"


def test_a_job_without_pods_records_every_entry_as_unmeasured():
    recs = records_from_job(_job("Failed", "DeadlineExceeded"), [], BATCH, 1)
    assert all(r.outcome == Outcome.INFRA_ERROR and "DeadlineExceeded" in r.error for r in recs)


def test_the_worst_batch_message_fits_a_termination_message():
    fp = Fingerprint(product="NVIDIA GeForce RTX 3090 Ti with a long marketing name", compute_capability="8.6",
                     sm_count=84, memory_mib=24576, driver_version="550.127.05", cuda_runtime_version="12.6")
    for outcome, extra in ((Outcome.OK, {"t": 1.234567e-05, "ts": [1.2345678] * 16, "p": True}),
                           (Outcome.CORRECTNESS_ERROR, {"e": "wrong result " * 80})):
        answers = [Answer(i=10**6 + n, o=outcome, c=123.456, r=1234.567, **extra) for n in range(MAX_BATCH)]
        text = BatchResult(answers=answers, fingerprint=fp, error="x" * 5000).encode()
        assert len(text.encode()) <= MAX_MESSAGE_BYTES
        decoded = decode_batch(text)
        assert [(a.i, a.o, a.p) for a in decoded.answers] == [(a.i, a.o, a.p) for a in answers]  # every verdict kept


def test_a_batch_reads_back_as_trials_and_rejects_repeated_indexes():
    work = Batch.from_env(BATCH.to_env())
    assert [t.index for t in work.trials()] == [10, 11, 12, 13]
    assert work.trials()[1].config == {"x": 1} and work.trials()[1].problem_size == [64, 64]
    with pytest.raises(ValueError, match="distinct"):
        Batch(run="r", target="t", kernel=KernelRef(builtin="gemm"), problem_size=[1],
              entries=[Entry(index=1, config={}), Entry(index=1, config={})])
    with pytest.raises(ProtocolError):
        decode_batch(TrialResult(outcome=Outcome.OK, objective=1.0).encode())  # a single trial's message
