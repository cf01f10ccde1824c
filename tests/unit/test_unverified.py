"""Results whose outputs were never checked say so everywhere, and a wrong configuration is
never the best.

The fleet simulator computes no kernel outputs: its results are marked ``unverified`` in
the device report (a recording counts as checked only when its tuner says it verified),
and the mark reaches the pool's status, its events and the run's conditions, `fleettune
report` (table, JSON, HTML), the demo's table and the published ConfigMap. A configuration
the job found wrong (correctness_error) is recorded as invalid and never ranked, however
fast.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from fleettune.api import TuningRunSpec
from fleettune.commands.report import pool_reports, print_table, render_html, summary
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.pool import Pool
from fleettune.controller.publisher import entries
from fleettune.controller.reporting import Reporter
from fleettune.labels import CONFIG_KEYS_ANNOTATION, TARGET_LABEL, TRIAL_LABEL
from fleettune.optimize import Study
from fleettune.published import PublishedEntry, configmap_data, read_entries
from fleettune.results import TrialRecord, records_from_job
from fleettune.rollup import UNVERIFIED_NOTE, outputs_unverified, ranked, run_status, said, target_status
from fleettune.space import SearchSpace
from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.demo import _summary, _table
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.answer import answer_measurement
from fleettune_dev.sim.batch import answer_batch
from fleettune_dev.sim.recordings import Measurement
from fleettune_dev.sim.usersource import synthetic_measurement
from fleettune_job.protocol import (
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    TRIAL_ENV,
    Answer,
    Batch,
    BatchResult,
    Entry,
    Fingerprint,
    KernelRef,
    Outcome,
    Trial,
    decode_batch,
)

ROOT = Path(__file__).resolve().parents[2]
FLEET = default_fleet()
A100 = FLEET.pool("a100")
A100_LABELS = A100.node_labels("a100-0")
REAL = Fingerprint(product="NVIDIA H200", compute_capability="9.0", driver_version="570.1")
SIMULATED = Fingerprint(product="NVIDIA A100-PCIE-40GB", compute_capability="8.0", simulated=True, unverified=True)


def _user_trial(config: dict[str, int] | None = None) -> Trial:
    kernel = KernelRef(source_path="/k/scale.cu", function="scale", grid=["cdiv(problem_size[0], bx)"], block=["bx"])
    return Trial(run="r", target="a100", index=0, kernel=kernel, config=config or {"bx": 128},
                 problem_size=[1 << 20])


def _rec(index: int, outcome: Outcome, ms: float | None, fp: Fingerprint | None = SIMULATED,
         target: str = "a100") -> TrialRecord:
    return TrialRecord(target=target, index=index, config={"bx": 16 * (index + 1)}, key=str(index),
                       outcome=outcome, objective=ms, fingerprint=fp, recorded_at=f"2026-01-01T00:00:{index:02d}Z")


# -- the simulator marks what it cannot check ---------------------------------------------

def test_a_user_kernel_answered_by_the_simulator_is_unverified():
    trial = _user_trial()
    m = synthetic_measurement("__global__ void scale() {}", trial, "A100/8.0")
    result = answer_measurement(trial, A100, A100_LABELS, m).result
    assert result.outcome == Outcome.OK and result.fingerprint.simulated
    assert result.fingerprint.unverified


def test_a_recording_counts_as_checked_only_when_its_tuner_timed_a_check():
    trial = _user_trial()
    unchecked = answer_measurement(trial, A100, A100_LABELS, Measurement(time_ms=1.0, times=(1.0,))).result
    zero = answer_measurement(trial, A100, A100_LABELS, Measurement(1.0, (1.0,), verification_ms=0.0)).result
    checked = answer_measurement(trial, A100, A100_LABELS, Measurement(1.0, (1.0,), verification_ms=3.5)).result
    assert unchecked.fingerprint.unverified and zero.fingerprint.unverified
    assert not checked.fingerprint.unverified


def test_the_shipped_recordings_say_nothing_of_a_check_so_built_ins_are_unverified_too():
    config = {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 1, "tile_size_y": 3, "read_only": 1,
              "use_padding": 0, "use_shmem": 1}
    one = Batch(run="r", target="a100", kernel=KernelRef(builtin="convolution"), problem_size=[4096, 4096],
                entries=[Entry(index=3, config=config)])
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"nodeName": "a100-0", "containers": [
               {"name": "trial", "image": "t", "env": [{"name": TRIAL_ENV, "value": one.to_env()}]}]}}
    answer = FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0).answer(pod, A100_LABELS)
    (timed,) = answer.answers
    result = timed.answer.result
    assert result.outcome == Outcome.OK and not result.fingerprint.synthetic
    assert result.fingerprint.unverified and answer.result.fingerprint.unverified


def test_a_batch_is_unverified_when_any_of_its_measurements_is_and_the_mark_survives_the_message():
    trial = _user_trial()
    checked = answer_measurement(trial, A100, A100_LABELS, Measurement(1.0, (1.0,), verification_ms=3.5))
    unchecked = answer_measurement(trial, A100, A100_LABELS, Measurement(2.0, (2.0,)))
    work = Batch(run="r", target="a100", kernel=trial.kernel, problem_size=[1 << 20],
                 entries=[Entry(index=1, config={"bx": 64}), Entry(index=2, config={"bx": 128})])
    message = answer_batch(work, [checked, unchecked], slots=1).result
    assert decode_batch(message.encode()).fingerprint.unverified
    both_checked = answer_batch(work, [checked, checked], slots=1).result
    assert not decode_batch(both_checked.encode()).fingerprint.unverified
    # A real job's report carries no such key at all: its messages are as before.
    assert "unverified" not in BatchResult(fingerprint=REAL, done=True).encode()


def test_the_mark_never_costs_a_verdict_in_the_worst_batch_message():
    fp = Fingerprint(product="NVIDIA GeForce RTX 3090 Ti with a long marketing name", compute_capability="8.6",
                     sm_count=84, memory_mib=24576, driver_version="550.127.05", cuda_runtime_version="12.6",
                     simulated=True, synthetic=True, unverified=True)
    answers = [Answer(i=10**6 + n, o=Outcome.CORRECTNESS_ERROR, c=123.456, r=1234.567, e="wrong result " * 80)
               for n in range(MAX_BATCH)]
    text = BatchResult(answers=answers, fingerprint=fp, error="x" * 5000).encode()
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    decoded = decode_batch(text)
    assert decoded.fingerprint.unverified and [a.o for a in decoded.answers] == [a.o for a in answers]


# -- a wrong configuration is never the best -----------------------------------------------

def _batch_job(keys: list[str]) -> dict:
    return {"metadata": {"name": "run-a100-0010", "labels": {TARGET_LABEL: "a100", TRIAL_LABEL: "10"},
                         "annotations": {CONFIG_KEYS_ANNOTATION: json.dumps(keys)}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}}


def _pod(message: str) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "gpu-0"},
            "status": {"containerStatuses": [{"name": "trial", "state": {"terminated": {
                "exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:00:10Z"}}}]}}


def test_the_batch_path_records_a_wrong_configuration_as_invalid_and_never_ranks_it():
    work = Batch(run="run", target="a100", kernel=KernelRef(builtin="gemm"), problem_size=[64, 64],
                 entries=[Entry(index=10 + n, config={"mult": n + 1}) for n in range(3)])
    answers = [
        Answer(i=10, o=Outcome.OK, t=2.0, ts=[2.0]),
        # Fast because it computes half the grid: the job says so, with the time it saw.
        Answer(i=11, o=Outcome.CORRECTNESS_ERROR, t=1.0, e="wrong result in c: 2048 of 4096 elements wrong"),
        Answer(i=12, o=Outcome.OK, t=3.0, ts=[3.0]),
    ]
    message = BatchResult(answers=answers, fingerprint=REAL, done=True).encode()
    recs = records_from_job(_batch_job(["k0", "k1", "k2"]), [_pod(message)], work, 1)
    assert [r.outcome for r in recs] == [Outcome.OK, Outcome.CORRECTNESS_ERROR, Outcome.OK]
    assert [r.key for r in ranked(recs)] == ["k0", "k2"]
    status = target_status(name="a100", phase="Succeeded", budget=3, records=recs, running=0)
    assert status.best is not None and status.best.config == {"mult": 1}
    assert (status.valid, status.invalid) == (2, 1)


def test_a_study_never_chooses_a_wrong_configuration_as_its_best():
    space = SearchSpace.from_spec([{"name": "mult", "type": "ordinal", "values": [1, 2, 4]}], [])
    study = Study(space, strategy="random", seed=0)
    study.observe({"mult": 2}, Outcome.CORRECTNESS_ERROR, 0.5)
    study.observe({"mult": 1}, Outcome.OK, 2.0)
    study.observe({"mult": 4}, Outcome.OK, 3.0)
    assert study.best == ({"mult": 1}, 2.0)


# -- the mark reaches the status, its events and conditions ---------------------------------

def test_the_pools_status_marks_an_unchecked_best():
    status = target_status(name="a100", phase="Succeeded", budget=3, running=0, message="budget spent",
                           records=[_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25)])
    assert status.fingerprint is not None and status.fingerprint.unverified
    assert said(status) == f"budget spent; best 1.25 ms {UNVERIFIED_NOTE}"
    run = run_status(previous=None, generation=1, phase="Succeeded", targets=[status], results=None,
                     reason="Tuned", message="a100: " + said(status))
    assert run.best_summary == "(unverified) a100=1.25ms"
    assert UNVERIFIED_NOTE in next(c.message for c in run.conditions if c.type == "Ready")
    dumped = run.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["targets"][0]["fingerprint"]["unverified"] is True


def test_a_checked_best_is_not_marked_even_beside_unchecked_results():
    records = [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25, fp=REAL), _rec(2, Outcome.COMPILE_ERROR, None)]
    status = target_status(name="a100", phase="Succeeded", budget=3, running=0, message="budget spent",
                           records=records)
    assert status.fingerprint is not None and not status.fingerprint.unverified
    assert said(status) == "budget spent"
    real = target_status(name="h200", phase="Succeeded", budget=1, running=0, records=[_rec(0, Outcome.OK, 1.0, REAL)])
    assert real.fingerprint is not None and not real.fingerprint.unverified


def test_a_provisional_best_takes_the_mark_of_the_pods_that_ended():
    """An answer read from a running Pod's log has no fingerprint of its own (`Fingerprint()`):
    it is as unchecked as the answers of the Pods that ended."""
    records = [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25, fp=Fingerprint())]
    assert outputs_unverified(records)
    assert not outputs_unverified([_rec(0, Outcome.OK, 2.0, fp=REAL), _rec(1, Outcome.OK, 1.25, fp=Fingerprint())])


SPEC = TuningRunSpec.model_validate(yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"])


def test_the_target_event_and_the_runs_ready_condition_say_unverified():
    pool = Pool(spec=SPEC.targets[0], seed=0, key="a100", phase=PoolPhase.SUCCEEDED, message="budget spent")
    reporter = Reporter(logging.getLogger("test"))
    report = reporter.report(SPEC.model_copy(update={"predict_for": []}), {"a100": pool}, {},
                             [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25)], mono=0.0)
    assert (report.phase, report.reason) == ("Succeeded", "Tuned")
    assert report.message == f"a100: budget spent; best 1.25 ms {UNVERIFIED_NOTE}"
    body = {"metadata": {"name": "r", "generation": 1}, "spec": {}}
    status = reporter.status(report, previous=None, body=body, results={"configMapPrefix": "r"}, published=None,
                             published_name=None, extra={})
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert UNVERIFIED_NOTE in ready["message"]
    events = reporter.take_events()
    assert ("Normal", "TargetSucceeded", f"a100: budget spent; best 1.25 ms {UNVERIFIED_NOTE}") in events
    assert any(reason == "Tuned" and UNVERIFIED_NOTE in message for _, reason, message in events)


# -- `fleettune report`, the demo, the published entry ------------------------------------

def _run(records: list[TrialRecord]) -> dict:
    target = target_status(name="a100", phase="Succeeded", budget=3, running=0, records=records, device="A100")
    status = run_status(previous=None, generation=1, phase="Succeeded", targets=[target], results=None,
                        reason="Tuned", message="")
    return {"metadata": {"name": "conv", "namespace": "ns"},
            "status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}


def test_the_report_marks_an_unchecked_best_in_its_table_json_and_html():
    records = [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25)]
    run = _run(records)
    pools = pool_reports(run["status"], records)
    assert pools[0].unverified
    out = io.StringIO()
    print_table(run, pools, file=out)
    text = out.getvalue()
    assert "1.25 ms (unverified)" in text and "never compared with the reference" in text
    assert summary(pools)[0]["verified"] is False
    html = render_html(run, pools, b"")
    assert "1.25 ms (unverified)" in html and "Outputs not verified" in html
    # From the records alone (a status shrunk to its counters, or a pool removed from the spec).
    assert pool_reports({}, records)[0].unverified


def test_the_report_of_checked_results_says_nothing_of_it():
    records = [_rec(0, Outcome.OK, 2.0, REAL), _rec(1, Outcome.OK, 1.25, REAL)]
    run = _run(records)
    pools = pool_reports(run["status"], records)
    out = io.StringIO()
    print_table(run, pools, file=out)
    assert "unverified" not in out.getvalue() and summary(pools)[0]["verified"] is True
    assert "unverified" not in render_html(run, pools, b"")


def test_the_demo_table_and_summary_say_unverified():
    run = _run([_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25)])
    console = Console(record=True, width=160, color_system=None, force_terminal=False)
    console.print(_table(run, 3.0))
    assert "1.25 [unverified]" in console.export_text()
    console = Console(record=True, width=160, color_system=None, force_terminal=False)
    _summary(console, run)
    assert "1.25 ms [unverified: outputs not checked]" in console.export_text()


def test_the_published_entry_says_its_outputs_were_not_checked():
    pool = Pool(spec=SPEC.targets[0], seed=0, key="a100", problem_size=(4096, 4096))
    unchecked, = entries([pool], [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25)], kernel="k")
    checked, = entries([pool], [_rec(0, Outcome.OK, 2.0), _rec(1, Outcome.OK, 1.25, REAL)], kernel="k")
    assert not unchecked.verified and checked.verified
    data = configmap_data("r", [unchecked])
    assert json.loads(data["tuned.json"])["entries"][0]["verified"] is False
    assert data["a100.4096x4096.verified"] == "false"
    assert read_entries(data) == [unchecked]
    verified = configmap_data("r", [checked])
    assert "verified" not in json.loads(verified["tuned.json"])["entries"][0]
    assert not any(k.endswith(".verified") for k in verified)
    assert read_entries(verified)[0].verified


@pytest.mark.parametrize("value", [False, True])
def test_a_published_entry_reads_back_its_mark(value: bool):
    entry = PublishedEntry(pool="a", problem_size=(8,), config={"x": 1}, time_ms=1.0, verified=value)
    assert PublishedEntry.from_json(entry.to_json()).verified is value
