"""A status that tells the truth, with the planner and the cluster's stand-in
(tests/unit/controller/fleet_double.py): a kernel source deleted mid-run keeps what was measured in
the status and says what the run waits for; a parallelism beyond the pool's GPUs starts
no more Pods than they run, and Pods waiting to start count as pending, not running; a
finished pool whose budget is raised says so; lost results are no longer counted. The
cluster's side: tests/integration/test_status_truth.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_double import A100, FakeFleet
from test_planner import SPEC, timed

from fleettune.api import TargetSpec
from fleettune.controller.fleet import FleetView
from fleettune.jobs import entries_of
from fleettune.labels import TRIAL_LABEL
from fleettune_job import nvrtc
from fleettune_job.protocol import Outcome, TrialResult

ROOT = Path(__file__).resolve().parents[3]
SOURCE_MAP, USER_RUN = yaml.safe_load_all((ROOT / "examples" / "user-kernel.yaml").read_text())


def ready(f: FakeFleet) -> dict[str, Any]:
    assert f.status is not None
    return next(c for c in f.status["conditions"] if c["type"] == "Ready")


# ---------------------------------------------------------------------------- a source deleted mid-run


def transpose_ms(config: dict[str, Any]) -> TrialResult:
    ms = 1.0 + config["tile_dim"] / 64 + config["block_rows"] / 32 - 0.5 * config["use_shared"]
    return TrialResult(outcome=Outcome.OK, objective=ms, times=[ms])


def test_a_source_deleted_mid_run_keeps_the_pools_results_and_says_what_the_run_waits_for() -> None:
    spec = copy.deepcopy(USER_RUN["spec"])
    spec["targets"] = spec["targets"][:1]
    spec["strategy"] = {"name": "random", "seed": 2}
    spec["budget"] = {**spec["budget"], "trialsPerTarget": 10, "parallelism": 2, "trialsPerPod": 1}
    name, key = spec["kernel"]["source"]["configMap"], spec["kernel"]["source"]["key"]
    f = FakeFleet(spec=spec, measure=transpose_ms, config_maps={name: dict(SOURCE_MAP["data"])})
    f.step()
    f.finish()
    f.advance(5)
    f.step()  # two results in, two trials running
    before = f.target()
    assert before["completed"] == 2 and before["best"] and len(f.running()) == 2

    del f.config_maps[name]
    f.advance(16)  # the source is read again
    plan = f.step()
    assert plan.report is not None and (plan.report.phase, plan.report.reason) == ("Pending", "SourceNotFound")
    message = ready(f)["message"]
    assert message.startswith(f"spec.kernel.source.configMap: ConfigMap {name!r} not found")
    assert f"waiting for ConfigMap {name!r} key {key!r}" in message
    assert "2 result(s) measured so far are kept" in message
    assert f.status is not None and f.status["progress"] == "2/10"
    t = f.target()
    assert (t["completed"], t["best"], t["running"] + t["pending"]) == (2, before["best"], 2)
    assert not plan.create and not plan.finished

    # The trials that were running still count: recorded, and no new one starts.
    f.finish()
    plan = f.step()
    assert len(plan.records) == 2 and not plan.create and f.target()["completed"] == 4
    assert ready(f)["reason"] == "SourceNotFound" and "4 result(s)" in ready(f)["message"]

    # Back unchanged: the same round tunes on.
    f.config_maps[name] = dict(SOURCE_MAP["data"])
    f.advance(16)
    plan = f.step()
    assert plan.create and ready(f)["reason"] == "Tuning" and f.target()["round"] == 1
    assert f.run().phase == "Succeeded" and f.target()["completed"] == 10


def test_a_source_missing_from_the_start_is_waited_for_naming_the_configmap_and_key() -> None:
    spec = copy.deepcopy(USER_RUN["spec"])
    f = FakeFleet(spec=spec, measure=transpose_ms)
    plan = f.step()
    assert plan.report is not None and (plan.report.phase, plan.report.reason) == ("Pending", "SourceNotFound")
    assert plan.report.message == ("spec.kernel.source.configMap: ConfigMap 'transpose-source' not found in the "
                                   "run's namespace; waiting for ConfigMap 'transpose-source' key 'transpose.cu'")


@pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found: the operator's compile check is skipped")
def test_a_source_that_does_not_compile_fails_the_run_until_it_is_fixed() -> None:
    spec = copy.deepcopy(USER_RUN["spec"])
    spec["targets"] = spec["targets"][:1]
    spec["budget"] = {**spec["budget"], "trialsPerTarget": 4, "parallelism": 2, "trialsPerPod": 1}
    name, key = spec["kernel"]["source"]["configMap"], spec["kernel"]["source"]["key"]
    broken = dict(SOURCE_MAP["data"])
    broken[key] = broken[key].replace("blockIdx.x", "blockIdy.x")
    f = FakeFleet(spec=spec, measure=transpose_ms, config_maps={name: broken})
    plan = f.step()
    assert (plan.report.phase, plan.report.reason) == ("Failed", "InvalidSpec") and not plan.create
    assert "blockIdy" in ready(f)["message"] and not plan.finished

    # Read again unchanged: not compiled again, and the compiler's message stays.
    f.advance(16)
    plan = f.step()
    assert plan.report.reason == "InvalidSpec" and "blockIdy" in ready(f)["message"] and not plan.create

    # The fix is enough: the run reads the new source and tunes it.
    f.config_maps[name] = dict(SOURCE_MAP["data"])
    f.advance(16)
    plan = f.step()
    assert plan.create and ready(f)["reason"] == "Tuning"
    f.finish()
    f.step()
    f.finish()
    f.step()
    assert f.run().phase == "Succeeded" and f.target()["completed"] == 4


# ---------------------------------------------------------------------------- parallelism and capacity


def test_parallelism_beyond_the_pools_gpus_starts_no_more_pods_than_they_run_and_says_so() -> None:
    f = FakeFleet(spec={**SPEC, "budget": {"trialsPerTarget": 100, "parallelism": 64}}, measure=timed,
                  gpus_per_node=2)  # two nodes: 4 GPUs
    plan = f.step()
    assert len(plan.create) == 4
    t = f.target()
    assert t["message"] == "parallelism 64 exceeds the pool's 4 GPUs: 4 at a time"
    # Created is not running: their Pods have not started yet.
    assert (t["running"], t["podsRunning"], t["podsPending"]) == (0, 0, 4)
    assert t["pending"] == sum(len(entries_of(j)) for j in plan.create)
    assert ready(f)["message"] == f"0 trials running, {t['pending']} pending"
    assert not f.step().create  # started now, and still no more than the GPUs
    t = f.target()
    assert (t["podsRunning"], t["podsPending"], t["pending"]) == (4, 0, 0)
    assert ready(f)["message"] == f"{t['running']} trials running"
    for _ in range(10):
        f.finish()
        f.step()
        assert len(f.jobs) <= 4


def test_pods_that_wait_for_a_gpu_count_as_pending_not_running() -> None:
    # Two nodes of one GPU each, a parallelism within them, but one GPU busy elsewhere: the
    # double starts two Pods at most; a third Job's Pod waits.
    f = FakeFleet(spec={**SPEC, "budget": {"trialsPerTarget": 30, "parallelism": 2, "trialsPerPod": 1}},
                  measure=timed, gpus_per_node=1)
    f.step()
    f.nodes.pop("gpu-1")  # the double's scheduler now has one GPU; the operator has not read the nodes yet
    f.step()
    t = f.target()
    assert (t["podsRunning"], t["podsPending"], t["running"], t["pending"]) == (1, 1, 1, 1)
    assert ready(f)["message"] == "1 trials running, 1 pending"
    assert f.status is not None and (f.status["trials"]["running"], f.status["trials"]["pending"]) == (1, 1)


def test_with_a_queue_admitted_pods_waiting_for_a_gpu_are_pending_and_the_gpus_bound_the_jobs() -> None:
    spec = {**SPEC, "budget": {"trialsPerTarget": 100, "parallelism": 64, "trialsPerPod": 1}, "queue": {"name": "gpu"}}
    f = FakeFleet(spec=spec, measure=timed, gpus_per_node=1)  # 2 GPUs
    for _ in range(6):
        f.step()
        f.admit()
    assert len(f.jobs) <= 2 and "exceeds the pool's 2 GPUs: 2 at a time" in f.target()["message"]


def test_a_pools_capacity_is_the_allocatable_gpus_of_its_schedulable_nodes() -> None:
    def node(name: str, gpus: str | None, cordoned: bool = False, **labels: str) -> dict[str, Any]:
        status = {"allocatable": {"cpu": "8", **({"nvidia.com/gpu": gpus} if gpus is not None else {})}}
        return {"metadata": {"name": name, "labels": {**A100, **labels}}, "spec": {"unschedulable": cordoned},
                "status": status}

    def target(**spec: Any) -> TargetSpec:
        return TargetSpec.model_validate(spec)

    view = FleetView()
    view.accept([node("a", "4"), node("b", "3"), node("c", "8", cordoned=True), node("d", "2", pool="other"),
                 node("e", None)], 1, 0.0)
    selector = {"nvidia.com/gpu.product": A100["nvidia.com/gpu.product"]}
    assert view.capacity(target(name="a100", nodeSelector=selector)) == (9, 9)  # a, b and d
    assert view.capacity(target(name="a100", nodeSelector=selector, gpus=2)) == (9, 4)  # 2 + 1 + 1 Pods
    assert view.capacity(target(name="other", nodeSelector={"pool": "other"})) == (2, 2)
    assert view.capacity(target(name="by-affinity")) is None  # the scheduler decides
    view.accept([node("e", None)], 2, 0.0)
    assert view.capacity(target(name="a100", nodeSelector=selector)) is None  # no node says


# ---------------------------------------------------------------------------- a raised budget


def test_a_finished_pool_whose_budget_is_raised_says_so_and_tunes_again() -> None:
    f = FakeFleet(spec=SPEC, measure=timed)
    assert f.run().phase == "Succeeded" and f.target()["message"] == "budget spent"
    f.edit(budget={**SPEC["budget"], "trialsPerTarget": 16})
    plan = f.step()
    message = "budget.trialsPerTarget raised from 12 to 16: tuning again"
    assert (f.target()["phase"], f.target()["message"]) == ("Running", message) and plan.create
    assert ("Normal", "TargetRunning", f"a100: {message}") in f.planner.events
    assert f.run().phase == "Succeeded" and f.target()["completed"] == 16
    assert f.target()["message"] == "budget spent"


# ---------------------------------------------------------------------------- lost results


def test_lost_records_are_no_longer_counted_and_their_trial_indices_are_not_reused() -> None:
    f = FakeFleet(spec={**SPEC, "budget": {"trialsPerTarget": 12, "parallelism": 3, "trialsPerPod": 1}},
                  measure=timed)
    for _ in range(3):
        f.step()
        f.finish()
        f.advance(5)
    f.step()
    kept, lost = f.store.records[:3], f.store.records[3:]
    assert lost
    f.store.records, f.store.keys = list(kept), {(r.round, r.target, r.index) for r in kept}
    f.planner.results_lost(lost)
    plan = f.step()
    assert f.target()["completed"] == 3
    highest = max(r.index for r in lost)
    assert all(int(j["metadata"]["labels"][TRIAL_LABEL]) > highest for j in plan.create)
    assert f.run().phase == "Succeeded" and sum(r.is_observation for r in f.records_of()) == 12
