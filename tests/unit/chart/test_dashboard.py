"""The Grafana dashboard only queries metrics the operator exports, and covers what the issue asks."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_support import metric_names
from prometheus_client import CollectorRegistry

from fleettune import metrics
from fleettune_job.protocol import Outcome

DASHBOARD = Path(__file__).resolve().parents[3] / "charts" / "fleettune" / "dashboards" / "fleettune.json"
# Grafana's standard units that fit what the panels show (no made-up ones such as "x").
UNITS = {"s", "ms", "percentunit", "short", "none", "bytes"}


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield f"${var['name']}", var["query"]["query"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_extractor_finds_metric_names() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, target) (rate(fleettune_trial_queue_wait_seconds_bucket'
            '{namespace=~"$namespace", outcome=~"a|b"}[$__rate_interval]))) / on (run) group_left '
            'fleettune_budget_trials and on (instance, job) fleettune_build_info or vector(0)')
    assert metric_names(expr) == {
        "fleettune_trial_queue_wait_seconds_bucket", "fleettune_budget_trials", "fleettune_build_info"
    }
    assert metric_names('label_values(fleettune_run_phase{namespace=~"$namespace"}, run)') == {"fleettune_run_phase"}
    assert metric_names("fleettune_run_phase offset 30m > 0.2 and increase(fleettune_trials_total[1h]) >= 3") == {
        "fleettune_run_phase", "fleettune_trials_total"
    }


def test_every_query_uses_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    # A fresh Metrics has every fleettune family; the operator's registry adds process_*.
    exported = metrics.operator_metrics().sample_names()
    assert "fleettune_trials_total" in exported
    checked = 0
    for where, expr in queries(dashboard):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{where}: {sorted(unknown)} are not exported by fleettune.metrics"
        checked += 1
    assert checked >= 20


def test_a_typo_would_be_caught(dashboard: dict[str, Any]) -> None:
    exported = metrics.Metrics(CollectorRegistry()).sample_names()
    assert metric_names("rate(fleettune_trial_total[5m])") - exported == {"fleettune_trial_total"}


def test_dashboard_covers_the_issue(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for _, e in queries(dashboard)))
    assert {
        "fleettune_best_objective_seconds",  # best-so-far curves
        "fleettune_budget_used_trials",  # ... against trials
        "fleettune_trials_total",  # outcome rates
        "fleettune_trials_in_flight", "fleettune_trials_parallelism",  # fleet utilisation
        "fleettune_trial_queue_wait_seconds_bucket",  # queue wait
        "fleettune_suggestion_duration_seconds_bucket",  # suggestion latency
        "fleettune_pool_stale",  # stale pools
        "fleettune_pool_fingerprint_info",
    } <= used
    outcome_regexes = " ".join(e for _, e in queries(dashboard) if "fleettune_trials_total" in e)
    for outcome in (o.value for o in Outcome if o.is_invalid_configuration):
        assert outcome in outcome_regexes  # the "invalid" rate misses no invalid outcome
    assert 'outcome="infra_error"' in outcome_regexes and 'outcome="ok"' in outcome_regexes


def test_dashboard_structure(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "fleettune"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance", "namespace", "run", "target"} <= variables
    # Provisioned from the chart's ConfigMap: edits in Grafana would be lost at the next sync.
    assert dashboard["editable"] is False
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var in variables or var.startswith("__"), f"{panel['title']}: unknown ${var}"


def test_every_panel_has_a_standard_unit(dashboard: dict[str, Any]) -> None:
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit in UNITS, f"{panel['title']}: unit {unit!r}"
        for override in panel["fieldConfig"].get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in UNITS, f"{panel['title']}: override unit {prop['value']!r}"
    best = [p for p in dashboard["panels"] if any("best_objective" in t["expr"] for t in p.get("targets", []))]
    assert best and all(p["fieldConfig"]["defaults"]["unit"] == "s" for p in best)  # the metric is in seconds


def test_job_and_instance_variables_scope_every_query(dashboard: dict[str, Any]) -> None:
    """As Grafana's dashboard linter asks: job and instance variables (multi, all = .+) from the
    templated data source, and every query filtered by them (two operators, two releases)."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("job", "instance"):
        var = variables[name]
        assert var["type"] == "query" and var["label"] == name and var["multi"] is True
        assert var["allValue"] == ".+" and var["datasource"]["uid"] == "${datasource}"
        assert metric_names(var["query"]["query"]) <= metrics.operator_metrics().sample_names()
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names.index("job") < names.index("instance") < names.index("namespace")  # each scopes the next
    for where, expr in queries(dashboard):
        if where in ("$job", "$instance"):
            continue
        for selector in re.findall(r"\b(?:fleettune|process)_\w+(\{[^}]*\})?", expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, f"{where}: {expr}"
