"""A warm start from results a user already has: a Kernel Tuner cache of another GPU, in a
ConfigMap the run names (`spec.warmStart`), read by the real operator from the real API
server; a run naming a ConfigMap that is not there yet waits for it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import yaml
from operator_support import apply, example, get_run, wait_for, wait_phase

from fleettune_dev.cluster import kstatus

RECORDING = Path(__file__).resolve().parents[2] / "dev" / "fleettune_dev" / "data" / "recordings" / \
    "convolution_milo-A4000.json.gz"


def _users_cache(entries: int = 400) -> str:
    """The RTX A4000's Kernel Tuner cache of the demo kernel, its fastest entries and some
    failures: what a user tuned before, small enough for a ConfigMap (1 MiB) and for the
    operator's prior model to fit in seconds on the test machine."""
    doc = json.loads(gzip.decompress(RECORDING.read_bytes()))
    timed = sorted(((k, v) for k, v in doc["cache"].items() if isinstance(v.get("time"), int | float)),
                   key=lambda kv: kv[1]["time"])
    failed = [(k, v) for k, v in doc["cache"].items() if isinstance(v.get("time"), str)][:100]
    doc["cache"] = {k: {**v, "times": v.get("times", [])[:3]} for k, v in [*timed[:entries], *failed]}
    return json.dumps(doc)


def _events(cluster: Any, namespace: str, reason: str) -> list[str]:
    out = cluster.kubectl("get", "events", "-n", namespace, "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"] if e.get("reason") == reason]


def test_a_users_kernel_tuner_cache_warm_starts_the_run_and_is_waited_for(cluster, namespace, simulator, operator):
    doc = example("warm", trialsPerTarget=6, parallelism=2)
    doc["spec"]["targets"] = doc["spec"]["targets"][:1]  # the A100 pool
    doc["spec"]["warmStart"] = [{"configMap": "a4000-cache", "key": "cache.json"}]
    assert apply(cluster, namespace, doc).returncode == 0
    waiting = wait_for(lambda: (r := get_run(cluster, namespace, "warm")).get("status") and
                       {c["type"]: c for c in r["status"]["conditions"]}["Ready"]["reason"] == "SourceNotFound" and r,
                       60, "the run to wait for its warm-start ConfigMap")
    assert waiting["status"]["phase"] == "Pending"
    # What Flux (`wait: true`) and the cli-utils applier say of the live run: not done yet.
    assert kstatus.compute([waiting])[0]["status"] == "InProgress"
    ready = {c["type"]: c for c in waiting["status"]["conditions"]}["Ready"]
    assert ready["message"] == "spec.warmStart[0].configMap: ConfigMap 'a4000-cache' not found"

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a4000-cache"},
          "data": {"cache.json": _users_cache()}}
    path = Path(cluster.state_dir) / f"{namespace}-cache.yaml"
    path.write_text(yaml.safe_dump(cm))
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))
    run = wait_phase(cluster, namespace, "warm", 240, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert kstatus.compute([run])[0]["status"] == "Current"
    said = wait_for(lambda: _events(cluster, namespace, "WarmStart"), 30, "the WarmStart event")
    assert said[0].startswith("a100: ") and "from spec.warmStart" in said[0]
    assert int(said[0].split()[1]) > 300  # the cache's configurations that exist in the run's space


def test_kstatus_reads_a_failed_and_an_edited_live_run(cluster, namespace, operator):
    bad = example("bad", trialsPerTarget=2)
    bad["spec"]["strategy"] = {"name": "bayes", "options": {"no_such_option": 1}}
    assert apply(cluster, namespace, bad).returncode == 0
    run = wait_phase(cluster, namespace, "bad", 60, operator)
    verdict = kstatus.compute([run])[0]
    assert verdict["status"] == "Failed" and "spec.strategy.options.no_such_option" in verdict["message"]
    # Edited: until the operator has seen the new generation, the run is not Current.
    bad["spec"]["strategy"] = {"name": "random"}
    assert apply(cluster, namespace, bad).returncode == 0
    edited = get_run(cluster, namespace, "bad")
    if edited["status"].get("observedGeneration") != edited["metadata"]["generation"]:
        assert kstatus.compute([edited])[0]["status"] == "InProgress"
    seen = wait_for(lambda: (r := get_run(cluster, namespace, "bad"))["status"].get("observedGeneration")
                    == r["metadata"]["generation"] and r, 60, "the operator to see the edit")
    expected = {"Pending": "InProgress", "Running": "InProgress", "Succeeded": "Current"}[seen["status"]["phase"]]
    assert kstatus.compute([seen])[0]["status"] == expected
