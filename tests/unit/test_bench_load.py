"""The load benchmark's pure parts: fleet sizing, manifests, latency matching, utilisation, audit."""

from __future__ import annotations

import math

import pytest

from fleettune.api import TuningRunSpec
from fleettune.results import TrialRecord
from fleettune_dev.bench.load import (
    NAMESPACE,
    Observer,
    PodTimes,
    audit,
    bench_fleet,
    idle_breakdown,
    job_controller_delays,
    pod_waits,
    quantile,
    reaction_latencies,
    run_manifests,
    utilisation,
)
from fleettune_job.protocol import Outcome


def test_fleet_has_the_gpus_asked_for_in_the_pools_asked_for():
    fleet = bench_fleet(300, 3, 4)
    assert [p.name for p in fleet.pools] == ["a100", "rtx-a4000", "jetson-orin"]
    assert sum(p.nodes * p.gpu.per_node for p in fleet.pools) == 300
    assert bench_fleet(48, 4, 4).pool_names()[3] == "a100-3"
    with pytest.raises(SystemExit):
        bench_fleet(301, 3, 4)


def test_manifests_are_valid_runs_whose_budgets_add_up():
    fleet = bench_fleet(24, 3, 4)
    docs = run_manifests(fleet, runs=4, trials=240, parallelism=3, strategy="random")
    assert len({d["metadata"]["name"] for d in docs}) == 4
    for doc in docs:
        spec = TuningRunSpec.model_validate(doc["spec"])
        assert [t.name for t in spec.targets] == fleet.pool_names()
        assert all(t.node_selector == {"fleettune.dev/pool": t.name} for t in spec.targets)
        assert spec.budget.parallelism == 3 and spec.strategy.name == "random"
    assert sum(d["spec"]["budget"]["trialsPerTarget"] * 3 for d in docs) == 240


def test_reaction_latency_pairs_each_end_with_the_next_job_of_its_run_and_pool():
    pods = {
        "a": PodTimes("r1", "a100", 0.0, 10.0),
        "b": PodTimes("r1", "a100", 0.0, 10.5),
        "c": PodTimes("r1", "a100", 11.0, 20.0),  # last one: no next Job
        "d": PodTimes("r2", "a100", 0.0, 10.0),  # another run's Jobs do not count
    }
    jobs = {"j0": ("r1", "a100", 0.0), "j1": ("r1", "a100", 10.2), "j2": ("r1", "a100", 11.5),
            "k0": ("r2", "a100", 0.0), "k1": ("r2", "a100", 13.0)}
    lat = reaction_latencies(pods, jobs)
    assert sorted(round(x, 3) for x in lat["a100"]) == [0.2, 1.0, 3.0]


def test_quantiles_and_utilisation():
    assert quantile([1, 2, 3, 4], 0.5) == 2 and quantile([1, 2, 3, 4], 0.99) == 4
    assert math.isnan(quantile([], 0.5))
    # Two GPUs, each busy for the whole 10 s window: 100 %.
    pods = {str(i): PodTimes("r", "p", float(s), float(s + 5)) for i, s in enumerate([0, 0, 5, 5])}
    overall, _, wall = utilisation(pods, gpus=2)
    assert overall == pytest.approx(1.0) and wall == 10
    overall, _, _ = utilisation(pods, gpus=4)
    assert overall == pytest.approx(0.5)


def _rec(target: str, index: int, outcome: Outcome = Outcome.OK) -> TrialRecord:
    return TrialRecord(target=target, index=index, config={}, key=f"{target}{index}", outcome=outcome,
                       objective=1.0 if outcome == Outcome.OK else None)


def test_audit_finds_losses_duplicates_and_budget_misses():
    answered = [(NAMESPACE, "r", "a", 0), (NAMESPACE, "r", "a", 1)]
    assert audit({"r": [_rec("a", 0), _rec("a", 1)]}, answered, 2, ["a"]) == []
    problems = audit({"r": [_rec("a", 0), _rec("a", 0)]}, [*answered, (NAMESPACE, "r", "a", 1)], 2, ["a"])
    text = "\n".join(problems)
    assert "answered twice" in text and "recorded twice" in text and "no record" in text
    assert audit({"r": [_rec("a", 0), _rec("a", 1, Outcome.INFRA_ERROR)]}, answered, 2, ["a"]) == [
        "r/a: 1 observations, budget 2"]


def test_audit_of_a_run_cut_short_ignores_trials_still_in_flight():
    answered = [(NAMESPACE, "r", "a", 0), (NAMESPACE, "r", "a", 1)]
    assert audit({"r": [_rec("a", 0)]}, answered, 5, ["a"], in_flight={("r", "a", 1)}) == []
    assert "no record" in audit({"r": [_rec("a", 0)]}, answered, 5, ["a"], in_flight={("r", "a", 7)})[0]


def test_job_controller_delays_and_jobs_recorded_ahead_of_it():
    obs = Observer(api_factory=None)
    obs.pods = {"p1": PodTimes("r", "a100", 0.0, 10.0), "p2": PodTimes("r", "a100", 0.0, 12.0),
                "p3": PodTimes("r", "a100", 0.0, None)}  # still running: neither
    obs.job_of_pod = {"p1": "j1", "p2": "j2", "p3": "j3"}
    obs.jobs_done = {"j1": 12.5}  # j2 was deleted before the Job controller marked it (a run stopping)
    delays, ahead = job_controller_delays(obs)
    assert delays == [2.5] and ahead == 1


def test_pod_waits_split_scheduling_from_starting():
    pods = {"a": PodTimes("r", "p", started=3.0, finished=9.0, created=0.0, bound=2.0, unschedulable=True),
            "b": PodTimes("r", "p", started=None, finished=None, created=1.0, bound=None)}  # still pending
    scheduling, starting, full = pod_waits(pods)
    assert scheduling == [2.0] and starting == [1.0] and full == 1


def test_idle_breakdown_attributes_each_idle_gpu_second_once():
    # A pool of 2 GPUs over [0, 10): Pod x runs 0-10 on one GPU. Pod y is created at 2, waits
    # for a node until 4, is bound but not running until 5, runs 5-10. So the second GPU is
    # idle 0-2 (no Pod), 2-4 (scheduler), 4-5 (kwok).
    pods = {
        "x": PodTimes("r", "p", created=0.0, bound=0.0, started=0.0, finished=10.0),
        "y": PodTimes("r", "p", created=2.0, bound=4.0, started=5.0, finished=10.0),
    }
    shares = idle_breakdown(pods, {"p": 2}, (0.0, 10.0))
    assert shares == pytest.approx({"kwok": 0.05, "scheduler": 0.10, "no Pod": 0.10})
    # A waiting Pod only explains idle GPUs: with one GPU, y's wait is not idle time.
    assert idle_breakdown(pods, {"p": 1}, (0.0, 10.0)) == pytest.approx(
        {"kwok": 0.0, "scheduler": 0.0, "no Pod": 0.0})
