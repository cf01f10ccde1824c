"""A Triton kernel on the real control plane: checked before any Job (read without running
it, compiled by Triton for each pool's GPU), then tuned by the fleet simulator, which compiles
each configuration with Triton for the node's GPU (`examples/triton-matmul.yaml` in
test_examples_run.py tunes it end to end on three pools)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from operator_support import ROOT, apply, jobs, wait_phase

from fleettune_job import tritonsource

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not tritonsource.available(), reason="Triton is not installed (the triton extra)"),
]

SOURCE_MAP, RUN = yaml.safe_load_all((ROOT / "examples" / "triton-matmul.yaml").read_text())


CASES = {  # run name -> (an edit of the source, the condition's message's start)
    "triton-broken": (lambda s: s.replace("tl.dot(x, y)", "tl.dot(x, y_typo)"),
                      "spec.kernel.triton: with kernel.defaultConfig, for sm_80: CompilationError"),
    "triton-runs-code": (lambda s: "import subprocess\n" + s,
                         "spec.kernel.triton.function: line 1: import of 'subprocess'"),
}


def test_a_triton_source_that_cannot_work_fails_the_run_before_any_job(cluster, namespace, operator):
    for name, (edit, _) in CASES.items():
        source_map, run = copy.deepcopy(SOURCE_MAP), copy.deepcopy(RUN)
        source_map["metadata"]["name"] = f"{name}-src"
        source_map["data"]["matmul.py"] = edit(source_map["data"]["matmul.py"])
        run["metadata"] = {"name": name}
        run["spec"]["kernel"]["triton"]["configMap"] = f"{name}-src"
        run["spec"]["targets"] = run["spec"]["targets"][:1]
        for doc in (source_map, run):
            applied = apply(cluster, namespace, doc)
            assert applied.returncode == 0, applied.stderr

    for name, (_, says) in CASES.items():
        done = wait_phase(cluster, namespace, name, 60, operator)
        ready = next(c for c in done["status"]["conditions"] if c["type"] == "Ready")
        assert (done["status"]["phase"], ready["reason"]) == ("Failed", "InvalidSpec"), ready
        assert ready["message"].startswith(says), ready["message"]
        assert not jobs(cluster, namespace, name)
        out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
                              "-o", "json")
        assert any(e["reason"] == "InvalidSpec" for e in json.loads(out.stdout)["items"])
