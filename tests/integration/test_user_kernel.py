"""A user's own CUDA kernel, end to end on the real control plane.

The real operator (the chart's RBAC), the fleet simulator (which compiles user source
for real with NVRTC, and times it with its model), and the example manifest
`examples/user-kernel.yaml`. Also what the operator checks before any Job: a missing
source ConfigMap (the run waits for it), a compile error, an unknown built-in — each in
a condition naming the field, with a Kubernetes Event, and with no Job started.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from operator_support import ROOT, apply, get_run, jobs, stored_records, wait_for, wait_phase

from fleettune_job import nvrtc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12)"),
]

SOURCE_MAP, RUN = yaml.safe_load_all((ROOT / "examples" / "user-kernel.yaml").read_text())


def user_run(name: str, trials: int = 6, **kernel: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    source_map, run = copy.deepcopy(SOURCE_MAP), copy.deepcopy(RUN)
    source_map["metadata"]["name"] = f"{name}-src"
    run["metadata"] = {"name": name}
    run["spec"]["kernel"]["source"]["configMap"] = f"{name}-src"
    run["spec"]["kernel"]["source"].update(kernel)
    run["spec"]["budget"].update(trialsPerTarget=trials, parallelism=2)
    run["spec"]["targets"] = run["spec"]["targets"][:1]
    return source_map, run


def condition(run: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in (run.get("status") or {}).get("conditions", []) if c["type"] == kind)


def events(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name},involvedObject.kind=TuningRun", "-o", "json")
    return json.loads(out.stdout)["items"]


def test_a_user_kernel_tunes_end_to_end(cluster, namespace, operator, simulator):
    source_map, run = user_run("transpose")
    run["spec"]["publish"] = {"configMapName": "transpose-tuned"}
    assert apply(cluster, namespace, source_map).returncode == 0
    assert apply(cluster, namespace, run).returncode == 0

    done = wait_phase(cluster, namespace, "transpose", 180, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    target = done["status"]["targets"][0]
    assert target["valid"] >= 1 and target["best"]["config"].keys() == run["spec"]["kernel"]["defaultConfig"].keys()
    records = stored_records(cluster, namespace, "transpose")
    assert len([r for r in records if r.is_observation]) == 6
    assert all(r.outcome.value != "infra_error" for r in records), [r.error for r in records]
    said = events(cluster, namespace, "transpose")
    reasons = {e["reason"] for e in said}
    assert {"TargetRunning", "TargetSucceeded", "Tuned"} <= reasons, reasons

    # The simulator computes no outputs: the best is unverified wherever it is shown.
    note = "[unverified: outputs not checked]"
    assert target["fingerprint"]["unverified"] is True
    assert note in condition(done, "Ready")["message"] and done["status"]["bestSummary"].startswith("(unverified)")
    assert any(e["reason"] == "TargetSucceeded" and note in e["message"] for e in said), said

    def published() -> dict[str, str] | None:
        out = cluster.kubectl("get", "configmap", "transpose-tuned", "-n", namespace, "-o", "json", check=False)
        return json.loads(out.stdout).get("data") if out.returncode == 0 else None

    data = wait_for(published, 30, "the published ConfigMap")
    assert all(e["verified"] is False for e in json.loads(data["tuned.json"])["entries"])
    assert [v for k, v in data.items() if k.endswith(".verified")] == ["false"]


HALF_SOURCE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void axpb(float *y, const float *x, int n) {
    const int i = blockIdx.x * size + threadIdx.x;
    if (i < n) y[i] = float(T(a) * T(x[i])) + b;
}
"""


def test_a_half_precision_kernel_with_common_parameter_names_tunes(cluster, namespace, operator, simulator):
    """cuda_fp16.h and cuda_bf16.h, and parameters named as in NVRTC's own header (size, T, a,
    b): the operator's check and the simulator compile them as the job image does."""
    source_map, run = user_run("half", trials=4)
    key = run["spec"]["kernel"]["source"]["key"]
    source_map["data"] = {key: HALF_SOURCE}
    run["spec"]["kernel"]["source"].update(
        function="axpb", grid=["cdiv(problem_size[0], size)"], block=["size"], verification={"atol": 0.1},
        arguments=[{"name": "y", "length": "problem_size[0]", "init": "zeros", "output": True},
                   {"name": "x", "length": "problem_size[0]"},
                   {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"}])
    run["spec"]["kernel"].update(problemSize=[65536], defaultConfig={"size": 128, "T": "float", "a": 2, "b": 1})
    run["spec"]["parameters"] = [
        {"name": "size", "values": [64, 128, 256]},
        {"name": "T", "type": "categorical", "values": ["float", "__half", "__nv_bfloat16"]},
        {"name": "a", "values": [1, 2]},
        {"name": "b", "values": [0, 1]},
    ]
    run["spec"]["constraints"] = []
    for doc in (source_map, run):
        applied = apply(cluster, namespace, doc)
        assert applied.returncode == 0, applied.stderr

    done = wait_phase(cluster, namespace, "half", 120, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    records = [r for r in stored_records(cluster, namespace, "half") if r.is_observation]
    assert len(records) == 4 and all(r.outcome.value == "ok" for r in records), [r.error for r in records]


def test_a_compile_error_fails_the_run_before_any_job_until_the_source_is_fixed(cluster, namespace, operator,
                                                                                simulator):
    source_map, run = user_run("broken")
    key = run["spec"]["kernel"]["source"]["key"]
    source_map["data"][key] = source_map["data"][key].replace("blockIdx.x", "blockIdy.x")
    for doc in (source_map, run):
        applied = apply(cluster, namespace, doc)
        assert applied.returncode == 0, applied.stderr

    done = wait_phase(cluster, namespace, "broken", 60, operator)
    ready = condition(done, "Ready")
    assert (done["status"]["phase"], ready["reason"]) == ("Failed", "InvalidSpec")
    assert ready["message"].startswith("spec.kernel.source: with kernel.defaultConfig, for sm_80: compile error:")
    assert "blockIdy" in ready["message"]
    assert not jobs(cluster, namespace, "broken")
    warnings = [e for e in events(cluster, namespace, "broken") if e["type"] == "Warning"]
    assert any(e["reason"] == "InvalidSpec" and "blockIdy" in e["message"] for e in warnings), warnings

    # Fixing the source is enough: the run notices the new source (its ConfigMap is watched) and tunes
    # it. That an unchanged source read again keeps the compiler's message: test_planner_truthful.py.
    source_map["data"][key] = SOURCE_MAP["data"][key]
    assert apply(cluster, namespace, source_map).returncode == 0
    wait_for(lambda: get_run(cluster, namespace, "broken")["status"]["phase"] != "Failed", 30, "the retry")


def test_a_missing_source_configmap_is_waited_for_then_used(cluster, namespace, operator, simulator):
    source_map, run = user_run("later", trials=2)
    applied = apply(cluster, namespace, run)
    assert applied.returncode == 0, applied.stderr

    def waiting() -> dict[str, Any] | None:
        status = get_run(cluster, namespace, "later").get("status") or {}
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        return ready if ready and ready["reason"] == "SourceNotFound" else None

    ready = wait_for(waiting, 30, "the SourceNotFound condition")
    key = run["spec"]["kernel"]["source"]["key"]
    assert ready["message"] == ("spec.kernel.source.configMap: ConfigMap 'later-src' not found in the run's namespace; "
                                f"waiting for ConfigMap 'later-src' key '{key}'")
    assert get_run(cluster, namespace, "later")["status"]["phase"] == "Pending"
    assert not jobs(cluster, namespace, "later")

    apply(cluster, namespace, source_map)  # GitOps tools may apply the ConfigMap second
    done = wait_phase(cluster, namespace, "later", 120, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"]


def test_an_unknown_builtin_is_refused_up_front(cluster, namespace, operator):
    _, run = user_run("typo")
    run["spec"]["kernel"] = {"builtin": "convolutoin", "problemSize": [4096, 4096]}
    applied = apply(cluster, namespace, run)
    assert applied.returncode == 0, applied.stderr

    done = wait_phase(cluster, namespace, "typo", 60, operator)
    ready = condition(done, "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.kernel.builtin: unknown built-in kernel 'convolutoin' (known: ")
    assert not jobs(cluster, namespace, "typo")


def published_entry(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "configmap", "-n", namespace, name, "-o", "json")
    data = json.loads(out.stdout)["data"]
    (entry,) = json.loads(data["tuned.json"])["entries"]
    flat = {k.split(".", 2)[2]: v for k, v in data.items() if k.count(".") >= 2}
    assert flat["generation"] == str(entry["generation"]) and flat["kernel"] == entry["kernel"], data
    return entry


def test_an_edited_source_is_another_kernel_and_starts_a_new_round(cluster, namespace, operator, simulator):
    """The ConfigMap is mounted live into trial Pods: results of two sources must not mix,
    and what is published follows the new round, even when its best is slower."""
    source_map, run = user_run("edited", trials=4)
    run["spec"]["budget"]["parallelism"] = 1
    run["spec"]["publish"] = {"configMapName": "edited-tuned"}
    apply(cluster, namespace, source_map)
    apply(cluster, namespace, run)
    first = wait_phase(cluster, namespace, "edited", 180, operator)
    digest = first["status"]["sourceDigest"]
    assert first["status"]["targets"][0]["round"] == 1
    published = wait_for(lambda: published_entry(cluster, namespace, "edited-tuned"), 30, "the first publish")
    assert published["generation"] == 1
    assert published["timeMs"] == pytest.approx(first["status"]["targets"][0]["best"]["objectiveMs"], rel=1e-4)

    key = run["spec"]["kernel"]["source"]["key"]
    source_map["data"][key] = "// tuned by hand\n" + source_map["data"][key]
    apply(cluster, namespace, source_map)

    def new_round() -> dict[str, Any] | None:
        status = get_run(cluster, namespace, "edited")["status"]
        target = status["targets"][0]
        return status if target["round"] == 2 and target["phase"] == "Succeeded" else None

    status = wait_for(new_round, 180, "the second round to finish")
    assert status["sourceDigest"] != digest
    rounds = {r.round for r in stored_records(cluster, namespace, "edited")}
    assert rounds == {1, 2}
    retunes = [e["message"] for e in events(cluster, namespace, "edited") if e["reason"] == "Retune"]
    assert retunes == ["a100: round 2: the kernel source changed"], retunes
    best = status["targets"][0]["best"]

    def republished() -> dict[str, Any] | None:
        entry = published_entry(cluster, namespace, "edited-tuned")
        return entry if entry["generation"] == 2 else None

    entry = wait_for(republished, 30, "round 2's best to be published")
    assert entry["config"] == best["config"] and entry["timeMs"] == pytest.approx(best["objectiveMs"], rel=1e-4)
    assert entry["kernel"] != published["kernel"]
