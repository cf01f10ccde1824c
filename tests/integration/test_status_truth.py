"""A status that tells the truth, on the real control plane with the real operator and the
fleet simulator:

1. a results ConfigMap deleted by hand mid-run is announced (a `ResultsLost` Warning naming
   the shard and its records) and no longer counted; and a parallelism beyond the pool's
   GPUs (the RTX A4000 pool: 2 nodes of 2) starts no more trial Pods than those run, saying so;
2. a user kernel's source ConfigMap deleted mid-run keeps every pool's counts and bests in
   the status, which says what the run waits for; back, the run tunes on.

The planner's side: tests/unit/controller/test_planner_truthful.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from operator_support import apply, example, get_run, stored_records, wait_for, wait_phase

from fleettune import GROUP, VERSION
from fleettune.labels import RESULTS_OF_LABEL
from fleettune.names import label_value

pytestmark = pytest.mark.integration


def events(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name},involvedObject.kind=TuningRun", "-o", "json")
    return json.loads(out.stdout)["items"]


def target(run: dict[str, Any]) -> dict[str, Any]:
    return ((run.get("status") or {}).get("targets") or [{}])[0]


def ready(run: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (run.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})


def test_a_deleted_results_shard_is_announced_and_uncounted_and_pods_never_outnumber_gpus(
        cluster, namespace, operator, simulator):
    run = example("lost", trialsPerTarget=24, parallelism=64, trialsPerPod=1)
    run["spec"]["targets"] = [t for t in run["spec"]["targets"] if t["name"] == "rtx-a4000"]
    run["spec"]["strategy"] = {"name": "random", "seed": 5}
    run["apiVersion"], run["kind"] = f"{GROUP}/{VERSION}", "TuningRun"
    assert apply(cluster, namespace, run).returncode == 0

    def measured() -> list[dict[str, Any]] | None:
        # A Job whose Pod ended is deleted a step later: only Pods not ended count.
        pods = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"{GROUP}/run={label_value('lost')}",
                               "-o", "json")
        out = [p["metadata"]["name"] for p in json.loads(pods.stdout)["items"]
               if p["status"].get("phase") in ("Pending", "Running") and not p["metadata"].get("deletionTimestamp")]
        assert len(out) <= 4, f"{len(out)} trial Pods out on the pool's 4 GPUs: {out}"
        out = cluster.kubectl("get", "configmaps", "-n", namespace, "-l",
                              f"{RESULTS_OF_LABEL}={label_value('lost')}", "-o", "json")
        return json.loads(out.stdout)["items"] or None

    (shard,) = wait_for(measured, 60, "the first results", interval=0.5)
    name = shard["metadata"]["name"]
    assert target(get_run(cluster, namespace, "lost"))["message"] == \
        "parallelism 64 exceeds the pool's 4 GPUs: 4 at a time"
    cluster.kubectl("delete", "configmap", "-n", namespace, name)

    def announced() -> dict[str, Any] | None:
        return next((e for e in events(cluster, namespace, "lost") if e["reason"] == "ResultsLost"), None)

    event = wait_for(announced, 45, "the ResultsLost event")
    assert event["type"] == "Warning"
    assert re.fullmatch(rf"results ConfigMap {name} was deleted: its [1-9]\d* record\(s\) are lost; "
                        r"the \d+ that remain are counted", event["message"]), event["message"]

    done = wait_phase(cluster, namespace, "lost", 120, operator)
    records = stored_records(cluster, namespace, "lost")
    status = done["status"]
    assert done["status"]["phase"] == "Succeeded", status
    # The counts are those of the records that exist: the lost trials were measured again.
    assert status["results"]["records"] == len(records)
    assert target(done)["completed"] == sum(r.is_observation for r in records) == 24


def test_a_source_deleted_mid_run_keeps_the_results_in_the_status_and_waits_for_it(
        cluster, namespace, operator, simulator):
    from fleettune_job import nvrtc

    if not nvrtc.available():
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12)")
    from test_user_kernel import user_run

    source_map, run = user_run("srcgone", trials=40)  # long enough to be caught mid-run
    run["spec"]["budget"].update(parallelism=1, trialsPerPod=1)
    run["spec"]["strategy"] = {"name": "random", "seed": 3}
    for doc in (source_map, run):
        assert apply(cluster, namespace, doc).returncode == 0

    def measured() -> dict[str, Any] | None:
        current = get_run(cluster, namespace, "srcgone")
        return current if target(current).get("completed", 0) >= 2 else None

    before = target(wait_for(measured, 60, "two results", interval=0.5))
    assert before["best"], before
    cluster.kubectl("delete", "configmap", "-n", namespace, "srcgone-src")

    def waiting() -> dict[str, Any] | None:
        current = get_run(cluster, namespace, "srcgone")
        return current if ready(current).get("reason") == "SourceNotFound" else None

    try:
        current = wait_for(waiting, 45, "the SourceNotFound condition")
    except AssertionError:
        print(json.dumps(get_run(cluster, namespace, "srcgone").get("status"), indent=1)[:6000])
        print(operator.logs()[-6000:])
        raise
    key = run["spec"]["kernel"]["source"]["key"]
    assert f"waiting for ConfigMap 'srcgone-src' key '{key}'" in ready(current)["message"]
    kept = target(current)
    assert kept["completed"] >= before["completed"] and kept["best"]["objectiveMs"] <= before["best"]["objectiveMs"]
    assert current["status"]["progress"] == f"{kept['completed']}/40"

    assert apply(cluster, namespace, source_map).returncode == 0
    done = wait_phase(cluster, namespace, "srcgone", 120, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert target(done)["round"] == 1 and target(done)["completed"] == 40
