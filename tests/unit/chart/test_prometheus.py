"""The operator's metrics and the chart's alerts, checked by Prometheus's own promtool.

* `promtool check metrics` on the live ``/metrics`` of a Metrics object with every family
  filled in (naming conventions: base units, ``_total``, help texts);
* `promtool check rules` on the rule groups of the rendered PrometheusRule, and
  `promtool test rules` on series that make each alert fire, or not: a stuck run (and a
  same-named run of another namespace that is not), a new run, a pool without nodes,
  infrastructure failures, a stale pool.

promtool is built from the Go module proxy on first use (fleettune_dev.cluster.binaries).
"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import Helm, metric_names
from prometheus_client.parser import text_string_to_metric_families

from fleettune import metrics
from fleettune.results import TrialRecord
from fleettune.rollup import run_status, target_status
from fleettune_job.protocol import Fingerprint, Outcome


def promtool_run(promtool: Path, *args: str, stdin: str | None = None, cwd: Path | None = None) -> tuple[int, str]:
    proc = subprocess.run([str(promtool), *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr


def _filled() -> metrics.Metrics:
    """The operator's registry (process collectors included) with a series in every family."""
    m = metrics.operator_metrics()
    fp = Fingerprint(product="NVIDIA A100", driver_version="550.54", cuda_runtime_version="12.4",
                     compute_capability="8.0", simulated=True)
    recs = [
        TrialRecord(target="a100", index=0, config={"b": 16}, key="b=16", outcome=Outcome.OK, objective=2.0,
                    fingerprint=fp),
        TrialRecord(target="a100", index=1, config={"b": 32}, key="b=32", outcome=Outcome.OK, objective=0.8,
                    fingerprint=fp),
        TrialRecord(target="a100", index=2, config={"b": 64}, key="b=64", outcome=Outcome.COMPILE_ERROR),
    ]
    targets = [target_status(name="a100", phase="Running", budget=40, records=recs, running=2, default_key="b=16",
                             pods_running=1, trials_per_pod=4),
               target_status(name="orin", phase="Unschedulable", budget=40, records=[], running=0)]
    status = run_status(previous=None, generation=1, phase="Running", targets=targets, results=None,
                        reason="Tuning", message="").model_dump(by_alias=True, exclude_none=True, mode="json")
    m.observe_status("team-a", "conv", status, parallelism=4)
    for outcome in ("ok", "compile_error", "infra_error"):
        m.trial_recorded("team-a", "conv", "a100", outcome, gpu_s=0.5)
    m.trial_recorded("team-a", "conv", "a100", "ok", gpu_s=0.1, pruned=True)
    m.pod_finished("team-a", "conv", "a100", duration_s=1.5, queue_wait_s=0.4, admission_wait_s=12.0)
    m.suggestion_latency("team-a", "conv", "a100", 0.02)
    m.model_fit_latency("team-a", "conv", "a100", 0.7)
    m.reconcile_error("team-a", "conv")
    return m


def _scrape(m: metrics.Metrics) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = metrics.start_http_server(m, port, addr="127.0.0.1")
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        thread.join(5)


def test_live_metrics_pass_promtool(promtool: Path) -> None:
    text = _scrape(_filled())
    # Every family of the operator is in the checked text, with at least one series.
    scraped = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for family in metrics.Metrics.unregistered().registry.collect():
        assert any(n == family.name or n.startswith(family.name + "_") for n in scraped), family.name
    assert {"fleettune_best_objective_seconds", "fleettune_pool_phase"} <= scraped
    assert 'fleettune_best_objective_seconds{namespace="team-a",run="conv",target="a100"} 0.0008' in text
    rc, out = promtool_run(promtool, "check", "metrics", stdin=text)
    assert rc == 0 and not out.strip(), out


def test_promtool_check_metrics_would_catch_the_old_name(promtool: Path) -> None:
    """The check is real: the gauge in milliseconds this project exported before fails it."""
    text = _scrape(_filled()).replace("fleettune_best_objective_seconds", "fleettune_best_objective_milliseconds")
    rc, out = promtool_run(promtool, "check", "metrics", stdin=text)
    assert rc != 0 and 'use base unit "seconds" instead of "milliseconds"' in out, out


def _rule_groups(chart: Helm, *sets: str) -> dict[str, Any]:
    docs = chart.template("monitoring.yaml", sets=sets)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def test_alert_rules_pass_promtool_check(chart: Helm, promtool: Path, tmp_path: Path) -> None:
    groups = _rule_groups(chart)
    exported = metrics.operator_metrics().sample_names()
    for rule in groups["groups"][0]["rules"]:
        names = metric_names(rule["expr"])
        assert names and names <= exported, f"{rule['alert']}: {sorted(names - exported)} not exported"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    rc, out = promtool_run(promtool, "check", "rules", str(path))
    assert rc == 0 and "SUCCESS: 4 rules found" in out, out
    # ... and it does check: a broken expression is refused.
    groups["groups"][0]["rules"][0]["expr"] = "sum by (namespace (fleettune_run_phase)"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    rc, out = promtool_run(promtool, "check", "rules", str(path))
    assert rc != 0, out



STUCK_SUMMARY = "TuningRun {ns}/{run} records no trials"
STUCK_DESCRIPTION = ("The run has been Running with no trial recorded for 30m. Check `kubectl -n {ns} describe "
                     "tuningrun {run}`, its trial Jobs and the operator's log.")


def _stuck(ns: str, run: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": "warning", "team": "gpu-platform", "namespace": ns, "run": run,
                           "phase": "Running", "job": "fleettune", "instance": "10.0.0.1:8080"},
            "exp_annotations": {"summary": STUCK_SUMMARY.format(ns=ns, run=run),
                                "description": STUCK_DESCRIPTION.format(ns=ns, run=run)}}


def test_alerts_fire_on_what_they_describe(chart: Helm, promtool: Path, tmp_path: Path) -> None:
    """`promtool test rules`: the chart's alerts over series as the operator exports them, after a
    scrape that keeps the run's namespace (honorLabels) and adds job and instance."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(chart), sort_keys=False))
    target = 'job="fleettune", instance="10.0.0.1:8080"'

    def series(name: str, values: str, **labels: str) -> dict[str, str]:
        inner = ", ".join([target, *(f'{k}="{v}"' for k, v in labels.items())])
        return {"series": f"{name}{{{inner}}}", "values": values}

    pool = {"namespace": "team-a", "run": "conv", "target": "a100"}
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "a run that stops recording trials; a same-named run elsewhere that does not; a new run",
                "interval": "1m",
                "input_series": [
                    series("fleettune_run_phase", "1x120", namespace="team-a", run="conv", phase="Running"),
                    series("fleettune_run_phase", "1x120", namespace="team-b", run="conv", phase="Running"),
                    # team-a's last trial at 20 minutes; team-b's keep coming.
                    series("fleettune_trials_total", "0+1x20 20x100", **pool, outcome="ok"),
                    series("fleettune_trials_total", "0+1x120", namespace="team-b", run="conv", target="a100",
                           outcome="ok"),
                    # Started at 20 minutes, never records a trial.
                    series("fleettune_run_phase", "_x20 1x100", namespace="team-c", run="new", phase="Running"),
                ],
                "alert_rule_test": [
                    {"eval_time": "45m", "alertname": "FleettuneRunStuck", "exp_alerts": []},
                    {"eval_time": "70m", "alertname": "FleettuneRunStuck",
                     "exp_alerts": [_stuck("team-a", "conv"), _stuck("team-c", "new")]},
                ],
            },
            {
                "name": "pools without nodes, failing infrastructure, a stale pool",
                "interval": "1m",
                "input_series": [
                    series("fleettune_pool_phase", "1x120", **pool, phase="Unschedulable"),
                    series("fleettune_pool_phase", "0x120", **pool, phase="Running"),
                    series("fleettune_pool_phase", "0x30 1x90", namespace="team-a", run="conv", target="orin",
                           phase="Unschedulable"),
                    series("fleettune_trials_total", "0+1x120", **pool, outcome="ok"),
                    series("fleettune_trials_total", "0x60 0+1x60", **pool, outcome="infra_error"),
                    series("fleettune_pool_stale", "0x10 1x110", **pool),
                ],
                "alert_rule_test": [
                    {"eval_time": "50m", "alertname": "FleettunePoolUnschedulable", "exp_alerts": []},
                    {"eval_time": "70m", "alertname": "FleettunePoolUnschedulable", "exp_alerts": [{
                        "exp_labels": {"severity": "warning", "team": "gpu-platform", **pool},
                        "exp_annotations": {
                            "summary": "Pool a100 of TuningRun team-a/conv has no schedulable node",
                            "description": "No node matched the pool for 1h: check its nodeSelector, the node "
                                           "labels and the autoscaler."}}]},
                    {"eval_time": "60m", "alertname": "FleettuneInfraErrorsRising", "exp_alerts": []},
                    {"eval_time": "90m", "alertname": "FleettuneInfraErrorsRising", "exp_alerts": [{
                        "exp_labels": {"severity": "warning", "team": "gpu-platform", **pool},
                        "exp_annotations": {
                            "summary": "Infrastructure failures in pool a100 of team-a/conv",
                            # 1 in 2 trials, as increase() extrapolates it over the window.
                            "description": "49.15% of the pool's trials in the last 30 minutes failed for "
                                           "infrastructure reasons (evicted or failed Pods, lost nodes, image "
                                           "pulls)."}}]},
                    {"eval_time": "20m", "alertname": "FleettunePoolStale", "exp_alerts": []},
                    {"eval_time": "30m", "alertname": "FleettunePoolStale", "exp_alerts": [{
                        "exp_labels": {"severity": "warning", "team": "gpu-platform", **pool},
                        "exp_annotations": {
                            "summary": "Results of pool a100 of team-a/conv are stale",
                            "description": "The pool's GPU fingerprint changed since its results were measured: "
                                           "its published configuration may no longer be the fastest. The run's "
                                           "status says what changed; a new round re-tunes it."}}]},
                ],
            },
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    rc, out = promtool_run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert rc == 0 and "SUCCESS" in out, out


def test_alert_tests_can_fail(chart: Helm, promtool: Path, tmp_path: Path) -> None:
    """`promtool test rules` does compare: expecting no stuck alert for a run that is stuck fails."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups(chart), sort_keys=False))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'fleettune_run_phase{namespace="a", run="r", phase="Running"}',
                          "values": "1x120"}],
        "alert_rule_test": [{"eval_time": "70m", "alertname": "FleettuneRunStuck", "exp_alerts": []}],
    }]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    rc, out = promtool_run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert rc != 0 and "FleettuneRunStuck" in out, out


@pytest.mark.parametrize("setting", ["runStuckAfter=2h", "unschedulableFor=3h", "staleFor=1d"])
def test_alert_durations_come_from_values(chart: Helm, setting: str) -> None:
    key, value = setting.split("=")
    rules = {r["alert"]: r for r in _rule_groups(chart, f"metrics.prometheusRule.{setting}")["groups"][0]["rules"]}
    if key == "runStuckAfter":
        assert f"offset {value})" in rules["FleettuneRunStuck"]["expr"]
        assert f"[{value}]" in rules["FleettuneRunStuck"]["expr"]
    else:
        alert = "FleettunePoolUnschedulable" if key == "unschedulableFor" else "FleettunePoolStale"
        assert rules[alert]["for"] == value
