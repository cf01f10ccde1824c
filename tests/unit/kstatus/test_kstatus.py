"""What kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, as Flux's `wait: true` and
health checks, kpt and the cli-utils applier use it) says of a TuningRun in each phase.

The status documents are the operator's own (fleettune.rollup.run_status), so the
conditions kstatus reads cannot drift from what the operator writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleettune.rollup import run_status, target_status
from fleettune_dev.cluster.kstatus import compute


def run(generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "fleettune.dev/v1alpha1", "kind": "TuningRun",
        "metadata": {"name": "conv", "namespace": "ns", "generation": generation},
        "spec": {},
    }
    if status is not None:
        obj["status"] = status
    return obj


def status(phase: str, reason: str, message: str, generation: int = 1, pools: str = "Running",
           published: tuple[bool, str, str] | None = None) -> dict[str, Any]:
    ts = [target_status(name="a100", phase=pools, budget=10, records=[], running=0)]
    st = run_status(previous=None, generation=generation, phase=phase, targets=ts, results=None, reason=reason,
                    message=message, published=published)
    return st.model_dump(by_alias=True, exclude_none=True, mode="json")


def test_kstatus_in_every_phase(kstatus: Path) -> None:
    cases = {
        "pending": (run(1, status("Pending", "WaitingForNodes", "no node matches a100")), "InProgress"),
        "running": (run(1, status("Running", "Tuning", "7/60 trials")), "InProgress"),
        "succeeded": (run(1, status("Succeeded", "Tuned", "a100=0.55ms", pools="Succeeded")), "Current"),
        # Tuned, but its ConfigMap is someone else's: Flux's `wait` must not pass.
        "succeeded, publication refused": (run(1, status("Succeeded", "Tuned", "", pools="Succeeded", published=(
            False, "PublishRefused", "spec.publish.configMapName: ConfigMap x exists"))), "Failed"),
        "failed": (run(1, status("Failed", "InvalidSpec", "spec.constraints[0]: unknown name 'q'", pools="Failed")),
                   "Failed"),
        # The spec was edited (generation 2) and the operator has not caught up yet: whatever
        # the old status says, the run is not Current.
        "edited succeeded": (run(2, status("Succeeded", "Tuned", "", generation=1, pools="Succeeded")), "InProgress"),
        "edited failed": (run(2, status("Failed", "InvalidSpec", "", generation=1, pools="Failed")), "InProgress"),
        "edited, caught up": (run(2, status("Running", "Tuning", "", generation=2)), "InProgress"),
    }
    results = compute([obj for obj, _ in cases.values()], kstatus)
    got = {name: r["status"] for name, r in zip(cases, results, strict=True)}
    assert got == {name: want for name, (_, want) in cases.items()}, results
    by_name = dict(zip(cases, results, strict=True))
    assert by_name["failed"]["message"] == "spec.constraints[0]: unknown name 'q'"  # Stalled's message
    assert by_name["pending"]["message"] == "no node matches a100"  # Reconciling's message


def test_without_a_status_kstatus_says_current(kstatus: Path) -> None:
    """Why the operator writes a status as soon as it sees a run: kstatus calls an object
    with no status (or one without its conditions) Current, and Flux's `wait` would pass."""
    [bare, empty] = compute([run(1, None), run(1, {"phase": "Pending"})], kstatus)
    assert bare["status"] == empty["status"] == "Current"
