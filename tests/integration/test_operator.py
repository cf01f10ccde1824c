"""The real operator on the real local control plane with the simulated GPU fleet."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter

import pytest
from operator_support import (
    EXAMPLE,
    apply,
    example,
    get_run,
    jobs,
    stored_records,
    wait_for,
    wait_phase,
)

from fleettune.labels import POOL_LABEL
from fleettune_job.protocol import Outcome

pytestmark = pytest.mark.integration


def _node_pools(cluster) -> dict[str, str]:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(POOL_LABEL, "") for n in nodes}


def _audit(records, budget_per_target: int, targets: list[str]) -> None:
    ids = Counter((r.target, r.index) for r in records)
    assert not [k for k, n in ids.items() if n > 1], "a trial was recorded twice"
    for target in targets:
        mine = [r for r in records if r.target == target]
        observations = [r for r in mine if r.is_observation]
        assert len(observations) == budget_per_target, (target, len(observations))
        keys = Counter(r.key for r in observations)
        assert max(keys.values()) == 1, f"{target}: a configuration was evaluated twice"


def test_run_tunes_three_pools_and_each_trial_ran_on_its_own_pool(cluster, namespace, simulator, operator):
    budget = 10
    assert apply(cluster, namespace, example("fleet", trialsPerTarget=budget, parallelism=3)).returncode == 0
    run = wait_phase(cluster, namespace, "fleet", 300, operator)
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"] == f"{3 * budget}/{3 * budget}"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert all(c["observedGeneration"] == run["metadata"]["generation"] for c in status["conditions"])

    records = stored_records(cluster, namespace, "fleet")
    _audit(records, budget, ["a100", "rtx-a4000", "jetson-orin"])
    pools = _node_pools(cluster)
    for rec in records:
        assert rec.node, rec
        assert pools[rec.node] == rec.target, f"trial {rec.target}/{rec.index} ran on {rec.node} ({pools[rec.node]})"

    by_target = {t["name"]: t for t in status["targets"]}
    for name in ("a100", "rtx-a4000"):
        target = by_target[name]
        assert target["best"]["objectiveMs"] > 0 and target["defaultMs"] > 0
        assert target["speedup"] >= 1.0
        assert target["fingerprint"]["simulated"] is True and target["fingerprint"]["synthetic"] is False
    assert by_target["jetson-orin"]["fingerprint"]["synthetic"] is True
    # Recorded Jobs are deleted, the last ones once the Job controller has marked them done.
    wait_for(lambda: not jobs(cluster, namespace, "fleet"), 30, "the finished run's Jobs to be deleted")


def test_recorded_failures_are_stored_as_infeasible(cluster, namespace, simulator, operator):
    # A tiny space on the A100 pool: configurations that fail in the recording and one that works.
    doc = example("failures", trialsPerTarget=4, parallelism=2)
    spec = doc["spec"]
    fixed = {"block_size_x": 32, "block_size_y": 16, "tile_size_x": 2, "read_only": 1, "use_padding": 0,
             "use_shmem": 0}
    for p in spec["parameters"]:
        if p["name"] in fixed:
            p["values"] = [fixed[p["name"]]]
    spec["targets"] = [t for t in spec["targets"] if t["name"] == "a100"]
    spec["kernel"].pop("defaultConfig")
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_phase(cluster, namespace, "failures", 180, operator)
    records = stored_records(cluster, namespace, "failures")
    assert len(records) == 4
    failed = [r for r in records if r.outcome.is_invalid_configuration]
    assert failed, records
    for rec in failed:
        assert rec.is_observation and rec.objective is None and rec.error
    assert run["status"]["targets"][0]["invalid"] == len(failed)
    assert any(r.outcome == Outcome.OK for r in records)


def test_operator_killed_mid_run_resumes_without_duplicates_or_losses(cluster, namespace, simulator, operator):
    budget = 16
    assert apply(cluster, namespace, example("restart", trialsPerTarget=budget, parallelism=4)).returncode == 0
    wait_for(lambda: len(stored_records(cluster, namespace, "restart")) >= 8, 180, "some recorded trials")
    operator.kill()
    before = {(r.target, r.index) for r in stored_records(cluster, namespace, "restart")}
    time.sleep(3)  # trials keep finishing while no operator runs
    operator.start()
    run = wait_phase(cluster, namespace, "restart", 300, operator)
    assert run["status"]["phase"] == "Succeeded"
    records = stored_records(cluster, namespace, "restart")
    assert before <= {(r.target, r.index) for r in records}, "a recorded result was lost"
    _audit(records, budget, ["a100", "rtx-a4000", "jetson-orin"])
    answered = {(t, i) for (ns, run_name, t, i) in simulator.answered if ns == namespace and run_name == "restart"}
    assert answered <= {(r.target, r.index) for r in records}, "a trial that ran has no record"


def test_deleting_the_run_removes_its_jobs_and_results(cluster, namespace, simulator, operator):
    assert apply(cluster, namespace, example("doomed", trialsPerTarget=50, parallelism=2)).returncode == 0
    wait_for(lambda: jobs(cluster, namespace, "doomed"), 120, "trial jobs")
    wait_for(lambda: stored_records(cluster, namespace, "doomed"), 120, "a stored result")
    cluster.kubectl("delete", "-n", namespace, "tuningrun", "doomed", "--wait=true", "--timeout=60s")
    wait_for(lambda: not jobs(cluster, namespace, "doomed"), 90, "the run's jobs to be garbage-collected")
    wait_for(lambda: not stored_records(cluster, namespace, "doomed"), 90, "the run's results to be collected")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (lambda s: s.pop("targets"), "spec.targets"),
        (lambda s: s["budget"].update(parallelism=0), "spec.budget.parallelism"),
        (lambda s: s["parameters"][0].update(type="complex"), "spec.parameters[0].type"),
        (lambda s: s["kernel"].update(source={"configMap": "k", "function": "f", "grid": ["1"], "block": ["1"],
                                              "arguments": [{"name": "out", "length": "8", "output": True}]}),
         "exactly one of kernel.builtin, kernel.source or kernel.triton"),
        (lambda s: (s["kernel"].pop("builtin"), s["kernel"].update(triton={
            "configMap": "k", "function": "f", "grid": ["1"], "arguments": [{"name": "out", "length": "8"}]})),
         "spec.kernel.triton.arguments: Invalid value: \"object\": arguments: at least one array must be an output"),
        (lambda s: s["kernel"].update(builtin=None, source={"configMap": "k", "function": "f", "grid": ["1"],
                                                            "block": ["1"]}),
         "spec.kernel.source.arguments: Required value"),
        (lambda s: (s["kernel"].pop("builtin"), s["kernel"].update(source={
            "configMap": "k", "function": "f", "grid": ["1"], "block": ["1"],
            "arguments": [{"name": "out", "length": "8"}]})),
         "at least one array must be an output"),
        (lambda s: (s["kernel"].pop("builtin"), s["kernel"].pop("defaultConfig"), s["kernel"].update(source={
            "configMap": "k", "function": "f", "grid": ["1"], "block": ["1"],
            "arguments": [{"name": "out", "kind": "scalar", "output": True}]})),
         "a scalar argument needs a value"),
        (lambda s: s["parameters"].append(dict(s["parameters"][0])), "parameter names must be unique"),
        (lambda s: s["parameters"].append({"name": "r", "type": "real", "range": {"min": 2, "max": 1}}), "min > max"),
        (lambda s: s["targets"][0].update(name="Bad_Name"), "spec.targets[0].name"),
        (lambda s: s["kernel"].update(pruneSlowerThan=0.5), "kernel.pruneSlowerThan: 0 (off) or at least 1"),
    ],
)
def test_api_server_rejects_invalid_specs_naming_the_field(cluster, crd, namespace, patch, field):
    doc = example("invalid")
    patch(doc["spec"])
    out = apply(cluster, namespace, doc, "--dry-run=server")
    assert out.returncode != 0
    assert field in out.stderr, out.stderr


EXAMPLE_RUNS = [p for p in sorted(EXAMPLE.parent.glob("*.yaml")) if "kind: TuningRun" in p.read_text()]


@pytest.mark.parametrize("path", EXAMPLE_RUNS, ids=lambda p: p.name)
def test_examples_pass_server_side_validation(cluster, crd, namespace, path):
    out = cluster.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(path), check=False)
    assert out.returncode == 0, out.stderr


def test_semantic_errors_become_a_condition_naming_the_field(cluster, namespace, operator):
    doc = example("semantic")
    doc["spec"]["constraints"].append("block_size_q > 3")
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "semantic")).get("status", {}).get("phase") == "Failed" and r,
        60, "the run to fail validation",
    )
    ready = next(c for c in run["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.constraints[4]" in ready["message"] and "block_size_q" in ready["message"]
    assert not jobs(cluster, namespace, "semantic")


def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:  # the operator is still starting
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _total(samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and want <= lbl)


def test_metrics_move_while_the_run_progresses(cluster, namespace, simulator, operator):
    budget = 8
    # One configuration per Pod: batched Pods can finish the whole run between two scrapes.
    doc = example("observed", trialsPerTarget=budget, parallelism=2, trialsPerPod=1)
    assert apply(cluster, namespace, doc).returncode == 0
    early = wait_for(
        lambda: (s := _scrape(operator.metrics_url)) and _total(s, "fleettune_trials_total", run="observed") >= 2 and s,
        120, "the first trials in the metrics", interval=0.2,
    )
    run = wait_phase(cluster, namespace, "observed", 240, operator)
    late = _scrape(operator.metrics_url)
    trials = _total(late, "fleettune_trials_total", run="observed")
    assert trials > _total(early, "fleettune_trials_total", run="observed")
    recorded = run["status"]["trials"]
    assert trials == recorded["completed"] + recorded["infraFailed"]
    assert _total(late, "fleettune_suggestion_duration_seconds_count", run="observed") > 0
    for target in run["status"]["targets"]:
        best = _total(late, "fleettune_best_objective_seconds", run="observed", target=target["name"])
        assert best == pytest.approx(target["best"]["objectiveMs"] / 1000)
    assert _total(late, "fleettune_run_phase", run="observed", phase="Succeeded") == 1
