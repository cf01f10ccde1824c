"""The Argo CD health check (Lua) for TuningRuns, run in Lua 5.1 as Argo CD's gopher-lua does.

The check runs on status objects that the operator's own status writer produces
(fleettune.rollup.run_status), so the Lua and the conditions cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51  # a dev extra: embeds Lua 5.1, so no interpreter has to be installed
import yaml

from fleettune.rollup import run_status, target_status

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "deploy" / "argocd" / "tuningrun-health.lua"
CM_PATCH = ROOT / "deploy" / "argocd" / "argocd-cm-patch.yaml"


def health(obj: dict[str, Any]) -> tuple[str, str]:
    rt = lua51.LuaRuntime(unpack_returned_tuples=True)
    # Argo CD runs the script as a chunk with the object in the global `obj`.
    rt.globals().obj = rt.table_from(obj, recursive=True)
    hs = rt.execute(SCRIPT.read_text())
    return hs["status"], hs["message"] or ""


def run(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "fleettune.dev/v1alpha1", "kind": "TuningRun",
        "metadata": {"name": "conv", "namespace": "ns", "generation": generation},
        "spec": {},
    }
    if status is not None:
        obj["status"] = status
    return obj


def status_of(phase: str, targets: list[tuple[str, str]], reason: str, message: str = "", generation: int = 1,
              previous: Any = None) -> dict[str, Any]:
    ts = [target_status(name=n, phase=p, budget=10, records=[], running=0, message="") for n, p in targets]
    st = run_status(previous=previous, generation=generation, phase=phase, targets=ts, results=None,
                    reason=reason, message=message)
    return st.model_dump(by_alias=True, exclude_none=True, mode="json")


def test_no_status_yet_is_progressing() -> None:
    assert health(run())[0] == "Progressing"
    assert health(run(status={"phase": "Pending", "conditions": []}))[0] == "Progressing"


def test_running_is_progressing_with_the_progress() -> None:
    st = status_of("Running", [("a100", "Running")], "Tuning", "2 trials running")
    st["progress"] = "7/60"
    state, message = health(run(status=st))
    assert state == "Progressing"
    assert "7/60" in message


def test_succeeded_is_healthy() -> None:
    st = status_of("Succeeded", [("a100", "Succeeded"), ("rtx", "Succeeded")], "Tuned")
    st["bestSummary"] = "a100=0.554ms rtx=1.02ms"
    state, message = health(run(status=st))
    assert state == "Healthy"
    assert "a100=0.554ms" in message


def test_invalid_spec_is_degraded_with_the_reason() -> None:
    st = status_of("Failed", [], "InvalidSpec", "spec.constraints[4]: unknown name 'block_size_q'")
    state, message = health(run(status=st))
    assert state == "Degraded"
    assert message.startswith("InvalidSpec: spec.constraints[4]")


def test_all_targets_failed_is_degraded() -> None:
    st = status_of("Failed", [("a100", "Failed")], "AllTargetsFailed", "a100: 11 infrastructure failures")
    assert health(run(status=st))[0] == "Degraded"


def test_unschedulable_pool_while_running_is_degraded() -> None:
    st = status_of("Running", [("a100", "Running"), ("orin", "Unschedulable")], "Tuning", "no node matches")
    state, message = health(run(status=st))
    assert state == "Degraded"
    assert "no node matches" in message


def test_finished_with_a_failed_pool_is_degraded_not_healthy() -> None:
    st = status_of("Succeeded", [("a100", "Succeeded"), ("orin", "Failed")], "Tuned", "orin: failed")
    assert health(run(status=st))[0] == "Degraded"


def test_status_of_an_older_generation_is_progressing() -> None:
    # The user raised the budget (generation 2); the status still describes generation 1.
    st = status_of("Succeeded", [("a100", "Succeeded")], "Tuned", generation=1)
    state, message = health(run(generation=2, status=st))
    assert state == "Progressing"
    assert "generation 2" in message


def test_stale_conditions_alone_are_progressing() -> None:
    st = status_of("Succeeded", [("a100", "Succeeded")], "Tuned", generation=1)
    st["observedGeneration"] = 2  # only the conditions lag behind
    assert health(run(generation=2, status=st))[0] == "Progressing"


def test_finished_not_ready_without_degraded_is_degraded() -> None:
    conditions = [
        {"type": "Ready", "status": "False", "reason": "Stopped", "message": "", "observedGeneration": 1},
        {"type": "Progressing", "status": "False", "reason": "Finished", "message": "", "observedGeneration": 1},
    ]
    assert health(run(status={"observedGeneration": 1, "conditions": conditions}))[0] == "Degraded"


def test_configmap_patch_embeds_the_script_verbatim() -> None:
    patch = yaml.safe_load(CM_PATCH.read_text())
    assert patch["metadata"]["name"] == "argocd-cm"
    assert patch["data"]["resource.customizations.health.fleettune.dev_TuningRun"] == SCRIPT.read_text()
