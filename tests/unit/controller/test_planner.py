"""The planner driven through whole runs, with no API server (tests/unit/controller/fleet_double.py
plays the cluster): finishing on a budget, deadlines, a stalled study, a driver change,
a deleted node, infrastructure failures, an exhausted space, a restart."""

from __future__ import annotations

from typing import Any

import pytest
from fleet_double import A100, FakeFleet

from fleettune.controller.lifecycle import IllegalTransition, PoolPhase
from fleettune.jobs import entries_of
from fleettune.labels import ROUND_LABEL
from fleettune.metrics import Metrics
from fleettune.optimize.batching import FIRST_CONFIGS
from fleettune_job.protocol import Outcome, TrialResult, infra_failure

DEFAULT = {"block_size_x": 16, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1, "read_only": 0,
           "use_padding": 1, "use_shmem": 1, "use_cmem": 1, "filter_height": 15, "filter_width": 15}
SPEC: dict[str, Any] = {
    "kernel": {"builtin": "convolution", "problemSize": [4096, 4096], "defaultConfig": DEFAULT},
    "parameters": [
        {"name": "block_size_x", "type": "ordinal", "values": [16, 32, 64, 128]},
        {"name": "block_size_y", "type": "ordinal", "values": [1, 2, 4, 8, 16]},
        {"name": "tile_size_x", "type": "ordinal", "values": [1, 2, 4]},
        {"name": "tile_size_y", "type": "ordinal", "values": [1, 2]},
        {"name": "read_only", "type": "ordinal", "values": [0, 1]},
        {"name": "use_padding", "type": "ordinal", "values": [0, 1]},
        {"name": "use_shmem", "type": "ordinal", "values": [1]},
        {"name": "use_cmem", "type": "ordinal", "values": [1]},
        {"name": "filter_height", "type": "ordinal", "values": [15]},
        {"name": "filter_width", "type": "ordinal", "values": [15]},
    ],
    "constraints": ["block_size_x * block_size_y <= device.max_threads_per_block"],
    "strategy": {"name": "random", "seed": 3},
    "budget": {"trialsPerTarget": 12, "parallelism": 3},
    "targets": [{"name": "a100", "nodeSelector": {"nvidia.com/gpu.product": A100["nvidia.com/gpu.product"]}}],
    "retunePolicy": "OnDriverChange",
}


def timed(config: dict[str, Any]) -> TrialResult:
    """A landscape with a best region and configurations that do not compile."""
    if config["tile_size_x"] == 4 and config["block_size_x"] == 128:
        return TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many registers")
    ms = 1.0 + abs(config["block_size_x"] - 64) / 64 + abs(config["block_size_y"] - 4) / 8 + config["read_only"]
    return TrialResult(outcome=Outcome.OK, objective=ms, times=[ms])


def fleet(measure: Any = timed, **budget: Any) -> FakeFleet:
    spec = {**SPEC, "budget": {**SPEC["budget"], **budget}}
    return FakeFleet(spec=spec, measure=measure)


def test_a_run_measures_the_default_first_and_ends_on_its_budget() -> None:
    f = fleet()
    peak = 0
    for _ in range(50):
        plan = f.step()
        peak = max(peak, len(f.running()))
        if plan.finished:
            break
        f.finish()
        f.advance(5)
    assert plan.report is not None and (plan.report.phase, plan.report.reason) == ("Succeeded", "Tuned")
    records = f.records_of()
    assert records[0].config == DEFAULT  # the speed-up's baseline
    assert sum(r.is_observation for r in records) == 12 and len({r.index for r in records}) == len(records)
    assert peak <= 3 and not f.jobs  # never over parallelism; every finished Job deleted once recorded
    t = f.target()
    assert (t["phase"], t["message"]) == ("Succeeded", "budget spent")
    assert t["best"]["objectiveMs"] == min(r.objective for r in records if r.objective)
    assert any(r.outcome == Outcome.COMPILE_ERROR for r in records) or t["valid"] == 12


def test_lowering_the_budget_stops_the_trials_that_would_overspend_it() -> None:
    f = fleet()
    f.step()
    assert len(f.running()) == 3
    f.finish(1)
    f.edit(budget={**SPEC["budget"], "trialsPerTarget": 1})
    plan = f.step()
    assert len(plan.delete_now) == 2 and not plan.create and not f.jobs
    assert f.target()["phase"] == "Succeeded" and plan.finished


def test_a_deadline_ends_the_round_and_stops_its_running_trials() -> None:
    f = fleet(deadlineSeconds=60)
    f.step()
    f.advance(61)
    plan = f.step()
    assert (f.target()["phase"], f.target()["message"]) == ("Succeeded",
                                                            "deadline reached (budget.deadlineSeconds=60)")
    assert len(plan.delete_now) == 3 and not f.jobs and plan.finished


def test_a_stalled_study_stops_on_patience_once_its_trials_are_in() -> None:
    flat = TrialResult(outcome=Outcome.OK, objective=2.0, times=[2.0])
    f = fleet(lambda config: flat, patience=3, parallelism=1, trialsPerTarget=50)
    report = f.run()
    assert report.phase == "Succeeded"
    # The best, then 3 without improvement: all of them in the first Pod, with the default.
    assert sum(r.is_observation for r in f.records_of()) == max(4, FIRST_CONFIGS)
    assert "patience" in f.target()["message"] or "improv" in f.target()["message"]


def test_a_driver_upgrade_starts_a_pinned_round_and_drops_the_old_rounds_trials() -> None:
    f = fleet(trialsPerTarget=6)
    f.step()
    f.finish(2)
    f.step()
    old = [j["metadata"]["name"] for j in f.running()]
    upgraded = {**A100, "nvidia.com/cuda.driver-version.full": "560.28.03"}
    f.set_nodes({"gpu-0": upgraded, "gpu-1": dict(upgraded)})
    plan = f.step()
    t = f.target()
    assert t["round"] == 2 and "round 2: GPU fingerprint changed" in t["message"] and "560.28.03" in t["message"]
    assert set(old) <= set(plan.delete_now)
    assert plan.create and all(j["metadata"]["labels"][ROUND_LABEL] == "2" for j in plan.create)
    pinned = plan.create[0]["spec"]["template"]["spec"]["nodeSelector"]
    assert "560.28.03" in pinned.values()
    assert plan.create[0]["spec"]["template"]["spec"]["containers"][0]["env"]  # and it is the default first
    assert f.run().phase == "Succeeded"
    assert {r.round for r in f.records_of()} == {1, 2}


def test_a_pool_whose_nodes_are_gone_waits_unschedulable_and_resumes() -> None:
    f = fleet()
    f.node_wait_s = 0  # no waiting for an autoscaler
    f.planner = f.new_planner()
    f.set_nodes({})
    plan = f.step()
    assert not plan.create and f.target()["phase"] == "Unschedulable"
    assert "no node matches spec.targets[a100].nodeSelector" in f.target()["message"]
    assert plan.report is not None and plan.report.phase == "Running" and not plan.finished
    f.set_nodes({"gpu-0": dict(A100)})
    plan = f.step()  # the pool's search is built at the first step that sees a node back
    assert f.target()["phase"] == "Running" and plan.create


def _degraded(f: FakeFleet) -> bool:
    assert f.status is not None
    return next(c for c in f.status["conditions"] if c["type"] == "Degraded")["status"] == "True"


def test_a_pool_scaled_to_zero_keeps_one_trial_pending_for_an_autoscaler_then_says_unschedulable() -> None:
    f = fleet()
    f.set_nodes({})
    plan = f.step()
    assert len(plan.create) == 1, "one pending trial Pod: what a cluster autoscaler scales up for"
    assert f.target()["phase"] == "Running" and not _degraded(f)
    assert "yet: 1 trial kept pending for a cluster autoscaler" in f.target()["message"]
    ready = next(c for c in f.status["conditions"] if c["type"] == "Ready")  # type: ignore[index]
    assert ready["message"].startswith("a100: no node matches") and "autoscaler" in ready["message"]
    deadline = plan.create[0]["spec"]["activeDeadlineSeconds"]
    assert deadline > 600, "waiting for the node must not time the trial out"
    f.advance(300)
    assert not f.step().create and f.target()["phase"] == "Running"  # still one pending, no more
    (waiting,) = f.running()
    waiting_configs = [c for _, c in entries_of(waiting)]
    f.advance(301)
    plan = f.step()
    assert f.target()["phase"] == "Unschedulable" and _degraded(f)
    # The trial kept pending stops asking an autoscaler for a node: withdrawn, nothing recorded.
    assert plan.delete_now == [waiting["metadata"]["name"]] and not plan.create and not f.running()
    back = f"{len(waiting_configs)} configuration(s) back in the queue"
    assert f"1 waiting trial Job(s) withdrawn, {back}" in f.target()["message"]
    assert ("Normal", "Withdrawn") in {e[:2] for e in f.planner.events} and not f.records_of()
    f.advance(60)
    assert not f.step().create and not f.running(), "an unschedulable pool starts nothing"
    assert f.target()["message"].endswith(f"; {back}, none counted as failed")
    f.set_nodes({"gpu-0": dict(A100)})  # the autoscaler came late: the pool tunes at full parallelism
    plan = f.step()
    assert f.target()["phase"] == "Running" and len(f.running()) == 3 and not _degraded(f)
    first = [c for job in plan.create for _, c in entries_of(job)]
    assert all(c in first for c in waiting_configs), "the withdrawn configuration is measured first"
    assert f.run().phase == "Succeeded"
    assert [r.config for r in f.records_of() if r.config in waiting_configs] == waiting_configs  # once each


def test_a_fixed_node_selector_is_tuned_on_at_the_next_step() -> None:
    spec = {**SPEC, "targets": [{"name": "a100", "nodeSelector": {"pool": "typo"}}]}
    f = FakeFleet(spec=spec, measure=timed)
    assert not f.step().create and f.target()["phase"] == "Unschedulable"
    f.edit(targets=SPEC["targets"])
    plan = f.step()
    assert f.target()["phase"] == "Running" and plan.create


def test_a_pool_whose_gpu_is_unknown_does_not_wait_for_nodes() -> None:
    spec = {**SPEC, "targets": [{"name": "a100", "nodeSelector": {"pool": "ghost"}}]}
    f = FakeFleet(spec=spec, measure=timed, nodes={})
    plan = f.step()
    assert not plan.create and f.target()["phase"] == "Unschedulable"


def test_infrastructure_failures_fail_the_pool_with_the_last_cause_and_record_no_invalid_config() -> None:
    f = fleet(lambda config: infra_failure("node lost"), maxInfraFailures=2)
    report = f.run()
    assert (report.phase, report.reason) == ("Failed", "AllTargetsFailed")
    t = f.target()
    assert t["message"].startswith("3 trial Pods lost to the infrastructure (budget.maxInfraFailures=2), "
                                   f"{t['infraFailed']} trials unmeasured")
    assert t["message"].endswith("the last: node lost")
    assert not any(r.is_observation for r in f.records_of())


def test_a_space_smaller_than_the_budget_ends_exhausted() -> None:
    spec = {**SPEC, "parameters": [p if p["name"] != "block_size_x" else {**p, "values": [16]}
                                   for p in SPEC["parameters"]]}
    spec["parameters"] = [p if p["name"] not in ("block_size_y", "tile_size_x", "tile_size_y", "read_only")
                          else {**p, "values": [DEFAULT[p["name"]]]} for p in spec["parameters"]]
    f = FakeFleet(spec=spec, measure=timed)
    assert f.run().phase == "Succeeded"
    assert f.target()["message"] == "search space exhausted" and len(f.records_of()) == 2


def test_a_restarted_planner_adopts_running_trials_and_never_repeats_one() -> None:
    f = fleet()
    f.step()
    f.finish(2)
    f.step()
    f.planner = f.new_planner()  # the operator restarts: status and store survive, memory does not
    report = f.run()
    assert report.phase == "Succeeded"
    records = f.records_of()
    assert len({r.index for r in records}) == len(records) and {r.job for r in records} == set(f.created)
    assert sum(r.is_observation for r in records) == 12


def test_an_invalid_strategy_option_fails_the_run_naming_the_field() -> None:
    f = FakeFleet(spec={**SPEC, "strategy": {"name": "random", "options": {"bogus": 1}}}, measure=timed)
    plan = f.step()
    assert plan.report is not None and plan.report.reason == "InvalidSpec"
    assert plan.report.message.startswith("spec.strategy.options.bogus")
    assert not plan.create


def test_the_model_fit_time_reaches_the_metric() -> None:
    # Past the space-filling design (10), so that models are fitted.
    spec = {**SPEC, "strategy": {"name": "bayes", "seed": 1}, "budget": {"trialsPerTarget": 24, "parallelism": 2}}
    f = FakeFleet(spec=spec, measure=timed)
    metrics = Metrics.unregistered()
    for _ in range(30):
        plan = f.step()
        for s in plan.suggested:
            metrics.suggestion_latency("ns", "conv", s.target, s.seconds)
            if s.fit_seconds is not None:
                metrics.model_fit_latency("ns", "conv", s.target, s.fit_seconds)
        if plan.finished:
            break
        f.finish()
    fits = metrics.registry.get_sample_value(
        "fleettune_model_fit_duration_seconds_count", {"namespace": "ns", "run": "conv", "target": "a100"})
    assert fits and fits > 0


def test_the_lifecycle_refuses_moves_it_does_not_have() -> None:
    assert PoolPhase.RUNNING.to(PoolPhase.SUCCEEDED) == PoolPhase.SUCCEEDED
    assert PoolPhase.SUCCEEDED.to(PoolPhase.RUNNING) == PoolPhase.RUNNING  # a new round
    with pytest.raises(IllegalTransition):
        PoolPhase.PENDING.to(PoolPhase.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        PoolPhase.SUCCEEDED.to(PoolPhase.FAILED)


def test_a_retune_request_starts_a_round_but_a_token_a_new_run_carries_does_not() -> None:
    f = fleet(trialsPerTarget=2)
    f.annotations["fleettune.dev/retune-requested-at"] = "t0"  # applied with the run: nothing to re-tune
    assert f.run().phase == "Succeeded" and f.target()["round"] == 1
    f.annotations["fleettune.dev/retune-requested-at"] = "t1"
    f.step()
    assert f.target()["round"] == 2 and "re-tune requested (t1)" in f.target()["message"]
    assert f.run().phase == "Succeeded" and sum(r.round == 2 for r in f.records_of()) == 2


def _kernel_tuner_cache(measure: Any) -> str:
    """A Kernel Tuner cache file of the test space, as Kernel Tuner writes one."""
    import itertools
    import json

    params = {p["name"]: p["values"] for p in SPEC["parameters"]}
    keys = list(params)
    cache = {}
    for values in itertools.product(*params.values()):
        config = dict(zip(keys, values, strict=True))
        if config["block_size_x"] * config["block_size_y"] > 1024:
            continue
        result = measure(config)
        time: Any = result.objective if result.outcome == Outcome.OK else "CompilationFailedConfig"
        cache[",".join(str(v) for v in values)] = {**config, "time": time, "times": [time] * 3
                                                    if result.outcome == Outcome.OK else []}
    return json.dumps({"device_name": "NVIDIA RTX A4000", "kernel_name": "convolution_kernel",
                       "tune_params_keys": keys, "tune_params": params, "objective": "time", "cache": cache})


def test_a_warm_start_from_a_users_kernel_tuner_cache_is_waited_for_then_primes_the_pools() -> None:
    spec = {**SPEC, "warmStart": [{"configMap": "kt-cache", "key": "cache.json"}]}
    f = FakeFleet(spec=spec, measure=timed)
    plan = f.step()
    assert plan.report is not None and (plan.report.phase, plan.report.reason) == ("Pending", "SourceNotFound")
    assert plan.report.message == "spec.warmStart[0].configMap: ConfigMap 'kt-cache' not found"
    assert not plan.create and not plan.finished
    f.config_maps["kt-cache"] = {"cache.json": _kernel_tuner_cache(timed)}
    f.advance(16)  # read again
    plan = f.step()
    assert plan.create, plan.report
    study = f.planner.pools["a100"].study
    assert study is not None and study.n_prior > 50  # every configuration of the cache in this space
    assert f.run().phase == "Succeeded"


def test_a_warm_start_file_that_cannot_be_read_names_the_field_and_only_listed_targets_use_one() -> None:
    spec = {**SPEC, "warmStart": [{"configMap": "kt", "key": "cache.json"}]}
    f = FakeFleet(spec=spec, measure=timed, config_maps={"kt": {"cache.json": "{not json"}})
    plan = f.step()
    assert plan.report is not None and (plan.report.phase, plan.report.reason) == ("Failed", "InvalidSpec")
    assert plan.report.message.startswith("spec.warmStart[0]: not a readable kernel-tuner file")
    spec = {**SPEC, "warmStart": [{"configMap": "kt", "key": "cache.json", "targets": ["elsewhere"]}]}
    f = FakeFleet(spec=spec, measure=timed, config_maps={"kt": {"cache.json": _kernel_tuner_cache(timed)}})
    f.step()
    study = f.planner.pools["a100"].study
    assert study is not None and study.n_prior == 0


def test_a_finished_pool_keeps_no_study_and_builds_none_again() -> None:
    """A finished run's loop lives until the run is deleted: a study (its candidate set,
    tens of MiB for a large space) kept per finished pool grew the operator with every run."""
    f = fleet()
    assert f.run().phase == "Succeeded"
    pool = f.planner.pools["a100"]
    assert pool.study is None and pool.space is not None  # the space still serves predictions
    for _ in range(3):
        f.advance(300)
        assert f.step().finished and f.planner.pools["a100"].study is None
    # After a restart, a finished pool's search is built once (its space), and its study dropped again.
    f.planner = f.new_planner()
    f.step()
    assert f.planner.pools["a100"].space is not None and f.planner.pools["a100"].study is None
    f.edit(budget={**SPEC["budget"], "trialsPerTarget": 16})  # a larger budget: a study again
    f.step()
    assert f.planner.pools["a100"].study is not None
    assert f.run().phase == "Succeeded" and f.target()["completed"] == 16
