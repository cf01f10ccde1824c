"""`kubectl apply -f examples/` in the demo fleet: every example ends Succeeded.

The examples tune built-in kernels nobody recorded on the demo GPUs (gemm, scan): the
simulator answers them from its synthetic model of the kernel, marked synthetic. Each
example is applied with its kernel, parameters, constraints and targets as written; only
its budget is cut to a few trials (and its problem sizes to the first two), so that the
whole directory tunes in well under a minute.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_support import apply, get_run, wait_for

from fleettune_job import nvrtc, tritonsource

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRIALS = 3  # per target (and problem size)


def _documents() -> list[dict[str, Any]]:
    docs = [d for path in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "TuningRun":
            budget = doc["spec"]["budget"]
            budget["trialsPerTarget"] = min(budget.get("trialsPerTarget", TRIALS), TRIALS)
            budget["parallelism"] = min(budget.get("parallelism", TRIALS), TRIALS)
            if "problemSizes" in doc["spec"]["kernel"]:
                doc["spec"]["kernel"]["problemSizes"] = doc["spec"]["kernel"]["problemSizes"][:2]
    return docs


def test_every_example_succeeds_in_the_demo_fleet(cluster, namespace, simulator, operator):
    docs = _documents()
    runs = [d for d in docs if d["kind"] == "TuningRun"]
    if not nvrtc.available():  # user source is compiled for real by the simulator
        runs = [d for d in runs if "source" not in d["spec"]["kernel"]]
    if not tritonsource.available():
        runs = [d for d in runs if "triton" not in d["spec"]["kernel"]]
    assert {d["spec"]["kernel"].get("builtin") for d in runs} >= {"convolution", "gemm", "scan"}
    for doc in docs:
        if doc["kind"] != "TuningRun" or doc in runs:
            assert apply(cluster, namespace, doc).returncode == 0, doc["metadata"]["name"]
    names = [d["metadata"]["name"] for d in runs]
    started = time.monotonic()

    def finished() -> dict[str, dict[str, Any]] | None:
        assert operator.proc.poll() is None, "operator died:\n" + operator.logs()[-4000:]
        got = {n: get_run(cluster, namespace, n) for n in names}
        return got if all(r.get("status", {}).get("phase") in ("Succeeded", "Failed") for r in got.values()) else None

    try:
        done = wait_for(finished, 150, "every example to finish")
    except AssertionError:
        print(operator.logs()[-6000:])
        raise
    summary = {n: (r["status"]["phase"], r["status"]["conditions"][0].get("message")) for n, r in done.items()}
    assert all(phase == "Succeeded" for phase, _ in summary.values()), summary
    for name, run in done.items():
        builtin = next(d for d in runs if d["metadata"]["name"] == name)["spec"]["kernel"].get("builtin")
        for target in run["status"]["targets"]:
            assert target["phase"] == "Succeeded" and target["infraFailed"] == 0, (name, target)
            assert target["valid"] >= 1, (name, target)
            if builtin in ("gemm", "scan"):  # no recording of these on any demo GPU
                assert target["fingerprint"]["synthetic"], (name, target)
    for run in (d for d in runs if (d["spec"].get("publish") or {}).get("format") == "vllm"):
        # The serving stacks' tables: one file per GPU, named by the driver's name for it.
        name = run["spec"]["publish"]["configMapName"]
        data = json.loads(cluster.kubectl("get", "configmap", name, "-n", namespace, "-o", "json").stdout)["data"]
        files = [item["path"] for item in json.loads(data["vllm-items.json"])]
        devices = {t["fingerprint"]["product"] for t in done[run["metadata"]["name"]]["status"]["targets"]}
        assert sorted(files) == sorted(f"E=1,N=14336,device_name={'_'.join(d.split())}.json" for d in devices)
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    assert not [e for e in events if e.get("reason") == "InfraFailure"], events
    print(f"examples tuned in {time.monotonic() - started:.0f} s")
