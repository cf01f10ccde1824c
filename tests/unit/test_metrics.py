"""The operator's Prometheus metrics: names, bounded labels, values that move, cleanup."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fleettune import metrics
from fleettune.metrics import Metrics, trial_timings

ALLOWED_LABELS = {
    "namespace", "run", "target", "outcome", "phase", "le",  # series identity
    "version", "product", "driver", "cuda", "compute_capability", "simulated",  # info metrics
}


@pytest.fixture
def m() -> Metrics:
    return Metrics(CollectorRegistry())


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_trials_are_counted_by_outcome_and_target(m: Metrics) -> None:
    m.trial_recorded("ns", "conv", "a100", "ok", gpu_s=1.5)
    m.trial_recorded("ns", "conv", "a100", "ok", gpu_s=2.5, pruned=True)
    m.trial_recorded("ns", "conv", "rtx", "compile_error")
    ok = {"namespace": "ns", "run": "conv", "target": "a100"}
    assert value(m, "fleettune_trials_total", **ok, outcome="ok") == 2
    assert value(m, "fleettune_trials_pruned_total", **ok) == 1  # and still an ok trial above
    assert value(m, "fleettune_trials_pruned_total", namespace="ns", run="conv", target="rtx") is None
    assert value(m, "fleettune_trials_total", namespace="ns", run="conv", target="rtx", outcome="compile_error") == 1
    assert value(m, "fleettune_trial_duration_seconds_count", **ok) == 2
    assert value(m, "fleettune_trial_duration_seconds_sum", **ok) == pytest.approx(4.0)
    assert value(m, "fleettune_gpu_busy_seconds_total", **ok) == pytest.approx(4.0)
    # A configuration that never reached the GPU has no GPU time (not a zero dragging quantiles down).
    assert value(m, "fleettune_trial_duration_seconds_count", namespace="ns", run="conv", target="rtx") is None


def test_a_pod_is_timed_once_whatever_its_batch(m: Metrics) -> None:
    m.pod_finished("ns", "conv", "a100", duration_s=30.0, queue_wait_s=0.2, gpus=2)
    m.pod_finished("ns", "conv", "a100", duration_s=10.0)
    ok = {"namespace": "ns", "run": "conv", "target": "a100"}
    assert value(m, "fleettune_pod_duration_seconds_count", **ok) == 2
    assert value(m, "fleettune_gpu_allocated_seconds_total", **ok) == pytest.approx(70.0)
    # A missing timing is not observed as zero.
    assert value(m, "fleettune_trial_queue_wait_seconds_count", **ok) == 1


def test_unknown_outcome_is_rejected(m: Metrics) -> None:
    # Outcomes are label values: anything outside the protocol's enum would be unbounded.
    with pytest.raises(ValueError):
        m.trial_recorded("ns", "conv", "a100", "config-17")


def test_pool_gauges_move_with_progress(m: Metrics) -> None:
    pool = {"namespace": "ns", "run": "conv", "target": "a100"}
    m.pool_progress("ns", "conv", "a100", used=1, budget=60, in_flight=2, parallelism=2, best_ms=0.9)
    m.pool_progress("ns", "conv", "a100", used=7, budget=60, in_flight=1, parallelism=2, best_ms=0.55, speedup=1.8)
    assert value(m, "fleettune_budget_used_trials", **pool) == 7
    assert value(m, "fleettune_budget_trials", **pool) == 60
    assert value(m, "fleettune_trials_in_flight", **pool) == 1
    assert value(m, "fleettune_trials_parallelism", **pool) == 2
    # Base units: the status's 0.55 ms is exported as seconds.
    assert value(m, "fleettune_best_objective_seconds", **pool) == pytest.approx(0.55e-3)
    assert value(m, "fleettune_speedup_ratio", **pool) == 1.8
    # No best yet (only invalid trials): the gauge keeps its last value rather than 0 ms.
    m.pool_progress("ns", "conv", "a100", used=8, budget=60, in_flight=0, parallelism=2, best_ms=None)
    assert value(m, "fleettune_best_objective_seconds", **pool) == pytest.approx(0.55e-3)


def test_run_phase_is_one_hot(m: Metrics) -> None:
    m.set_run_phase("ns", "conv", "Running")
    m.set_run_phase("ns", "conv", "Succeeded")
    phases = {p: value(m, "fleettune_run_phase", namespace="ns", run="conv", phase=p) for p in metrics.RUN_PHASES}
    assert phases == {"Pending": 0, "Running": 0, "Succeeded": 1, "Failed": 0}
    with pytest.raises(ValueError):
        m.set_run_phase("ns", "conv", "Exploding")


def test_pool_phase_is_one_hot_over_every_pool_phase(m: Metrics) -> None:
    from typing import get_args

    from fleettune.api import TargetPhase

    assert set(metrics.POOL_PHASES) == set(get_args(TargetPhase)) >= {"Unschedulable", "Running"}
    pool = {"namespace": "ns", "run": "conv", "target": "a100"}
    m.set_pool_phase("ns", "conv", "a100", "Unschedulable")
    m.set_pool_phase("ns", "conv", "a100", "Running")
    phases = {p: value(m, "fleettune_pool_phase", **pool, phase=p) for p in metrics.POOL_PHASES}
    assert phases == {p: (1 if p == "Running" else 0) for p in metrics.POOL_PHASES}
    with pytest.raises(ValueError):
        m.set_pool_phase("ns", "conv", "a100", "Sleeping")
    m.forget_target("ns", "conv", "a100")
    assert value(m, "fleettune_pool_phase", **pool, phase="Running") is None


def test_fingerprint_change_replaces_the_series(m: Metrics) -> None:
    m.fingerprint_info("ns", "conv", "a100", product="NVIDIA A100", driver="550.54", cuda="12.4")
    m.fingerprint_info("ns", "conv", "a100", product="NVIDIA A100", driver="560.35", cuda="12.6")
    samples = [s for f in m.registry.collect() if f.name == "fleettune_pool_fingerprint" for s in f.samples]
    assert [s.labels["driver"] for s in samples] == ["560.35"]


def test_suggestion_fit_stale_and_errors(m: Metrics) -> None:
    pool = {"namespace": "ns", "run": "conv", "target": "a100"}
    m.suggestion_latency("ns", "conv", "a100", 0.03)
    m.model_fit_latency("ns", "conv", "a100", 1.2)
    m.pool_stale("ns", "conv", "a100", True)
    m.reconcile_error("ns", "conv")
    assert value(m, "fleettune_suggestion_duration_seconds_bucket", **pool, le="0.05") == 1
    assert value(m, "fleettune_suggestion_duration_seconds_bucket", **pool, le="0.025") == 0
    assert value(m, "fleettune_model_fit_duration_seconds_count", **pool) == 1
    assert value(m, "fleettune_pool_stale", **pool) == 1
    assert value(m, "fleettune_reconcile_errors_total", namespace="ns", run="conv") == 1


def test_forget_run_drops_only_that_run(m: Metrics) -> None:
    for run in ("conv", "gemm"):
        m.trial_recorded("ns", run, "a100", "ok", 1.0)
        m.pod_finished("ns", run, "a100", 1.0, 1.0)
        m.pool_progress("ns", run, "a100", used=1, budget=5, in_flight=0, parallelism=1, best_ms=1.0)
        m.set_run_phase("ns", run, "Running")
        m.fingerprint_info("ns", run, "a100", product="A100", driver="1", cuda="12")
    m.forget_run("ns", "conv")
    runs = {s.labels.get("run") for f in m.registry.collect() for s in f.samples} - {None}
    assert runs == {"gemm"}
    m.forget_run("ns", "conv")  # idempotent: a deletion event may be seen twice


def test_forget_target_keeps_the_other_pools(m: Metrics) -> None:
    for target in ("a100", "rtx"):
        m.trial_recorded("ns", "conv", target, "ok", 1.0)
        m.pool_stale("ns", "conv", target, False)
    m.set_run_phase("ns", "conv", "Running")
    m.forget_target("ns", "conv", "rtx")
    targets = {s.labels.get("target") for f in m.registry.collect() for s in f.samples} - {None}
    assert targets == {"a100"}
    assert value(m, "fleettune_run_phase", namespace="ns", run="conv", phase="Running") == 1


def test_names_follow_prometheus_conventions_and_labels_are_bounded(m: Metrics) -> None:
    m.trial_recorded("ns", "conv", "a100", "ok", 1.0)
    m.pod_finished("ns", "conv", "a100", 1.0, 1.0)
    m.fingerprint_info("ns", "conv", "a100", product="A100", driver="1", cuda="12")
    families = [f for f in m.registry.collect() if f.name.startswith("fleettune_")]
    assert len(families) >= 14
    for fam in families:
        if fam.type == "counter":
            assert fam.samples == [] or all(s.name.endswith("_total") for s in fam.samples), fam.name
        if fam.type == "histogram":
            assert fam.name.endswith("_seconds"), fam.name
        if fam.type == "gauge" and not fam.name.endswith("_info"):
            # A unit, in base units (promtool check metrics, on the live text, in tests/unit/chart).
            assert fam.name.rsplit("_", 1)[-1] in {"seconds", "ratio", "trials", "phase", "stale", "flight",
                                                     "parallelism"}, fam.name
            assert not fam.name.endswith(("_milliseconds", "_ms", "_minutes")), fam.name
        for s in fam.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)


def test_sample_names_cover_series_not_yet_created(m: Metrics) -> None:
    names = m.sample_names()
    assert {"fleettune_trials_total", "fleettune_trial_duration_seconds_bucket",
            "fleettune_pool_fingerprint_info", "fleettune_run_phase"} <= names
    assert "fleettune_trials" not in names


def test_operator_registry_has_process_metrics() -> None:
    names = metrics.operator_metrics().sample_names()
    assert "process_resident_memory_bytes" in names
    assert "fleettune_build_info" in names


def _pod(scheduled: str | None, started: str | None, finished: str | None) -> dict:
    status: dict = {"conditions": [], "containerStatuses": []}
    if scheduled:
        status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled})
    if started:
        status["containerStatuses"].append(
            {"name": "trial", "state": {"terminated": {"startedAt": started, "finishedAt": finished}}}
        )
    return {"status": status}


def test_trial_timings_from_job_and_pods() -> None:
    job = {"metadata": {"creationTimestamp": "2025-01-01T00:00:00Z"}}
    pods = [
        _pod("2025-01-01T00:00:12Z", "2025-01-01T00:00:15Z", "2025-01-01T00:00:20Z"),  # first attempt
        _pod("2025-01-01T00:00:30Z", "2025-01-01T00:00:31Z", "2025-01-01T00:00:34Z"),  # retry: the last one counts
    ]
    t = trial_timings(job, pods)
    assert t.queue_wait_s == 12.0
    assert t.duration_s == 3.0


def test_trial_timings_unknown_when_the_pod_never_ran() -> None:
    job = {"metadata": {"creationTimestamp": "2025-01-01T00:00:00Z"}}
    t = trial_timings(job, [_pod(None, None, None)])
    assert t.duration_s is None and t.queue_wait_s is None


def test_http_server_serves_the_registry(m: Metrics) -> None:
    m.trial_recorded("ns", "conv", "a100", "ok", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = metrics.start_http_server(m, port, addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["fleettune_trials"].samples[0].value == 1.0


def test_observe_status_sets_every_gauge_from_a_real_status(m: Metrics) -> None:
    from fleettune.results import TrialRecord
    from fleettune.rollup import run_status, target_status
    from fleettune_job.protocol import Fingerprint, Outcome

    fp = Fingerprint(product="NVIDIA A100", driver_version="550.54", cuda_runtime_version="12.4",
                     compute_capability="8.0", simulated=True)
    recs = [
        TrialRecord(target="a100", index=0, config={"b": 16}, key="b=16", outcome=Outcome.OK, objective=2.0,
                    fingerprint=fp),
        TrialRecord(target="a100", index=1, config={"b": 32}, key="b=32", outcome=Outcome.OK, objective=0.8,
                    fingerprint=fp),
        TrialRecord(target="a100", index=2, config={"b": 64}, key="b=64", outcome=Outcome.COMPILE_ERROR),
        TrialRecord(target="a100", index=3, config={"b": 64}, key="b=64", outcome=Outcome.INFRA_ERROR),
    ]
    ts = [target_status(name="a100", phase="Running", budget=40, records=recs, running=3, default_key="b=16"),
          target_status(name="orin", phase="Unschedulable", budget=40, records=[], running=0)]
    status = run_status(previous=None, generation=1, phase="Running", targets=ts, results=None, reason="Tuning",
                        message="").model_dump(by_alias=True, exclude_none=True, mode="json")
    m.observe_status("ns", "conv", status, parallelism=4)
    a100 = {"namespace": "ns", "run": "conv", "target": "a100"}
    assert value(m, "fleettune_run_phase", namespace="ns", run="conv", phase="Running") == 1
    assert value(m, "fleettune_budget_used_trials", **a100) == 3  # infra failures do not spend the budget
    assert value(m, "fleettune_budget_trials", **a100) == 40
    assert value(m, "fleettune_trials_in_flight", **a100) == 3
    assert value(m, "fleettune_trials_parallelism", **a100) == 4
    assert value(m, "fleettune_best_objective_seconds", **a100) == pytest.approx(0.8e-3)
    assert value(m, "fleettune_speedup_ratio", **a100) == 2.5
    assert value(m, "fleettune_pool_stale", **a100) == 0
    assert value(m, "fleettune_pool_fingerprint_info", **a100, product="NVIDIA A100", driver="550.54", cuda="12.4",
                 compute_capability="8.0", simulated="true") == 1
    orin = {"namespace": "ns", "run": "conv", "target": "orin"}
    assert value(m, "fleettune_budget_used_trials", **orin) == 0
    assert value(m, "fleettune_best_objective_seconds", **orin) is None  # no result: no made-up best
    # The pool phase, one-hot (the Unschedulable alert reads it).
    assert value(m, "fleettune_pool_phase", **orin, phase="Unschedulable") == 1
    assert value(m, "fleettune_pool_phase", **orin, phase="Running") == 0
    assert value(m, "fleettune_pool_phase", **a100, phase="Running") == 1
    # Without the spec at hand (a settled run), the parallelism gauge is left alone.
    m.observe_status("ns", "conv", {**status, "phase": "Succeeded"})
    assert value(m, "fleettune_trials_parallelism", **a100) == 4
    assert value(m, "fleettune_run_phase", namespace="ns", run="conv", phase="Succeeded") == 1
