"""The load benchmark's pure parts: fleet sizing, manifests, latency matching, utilisation, audit."""

from __future__ import annotations

import argparse
import math

import pytest

from fleettune.api import TuningRunSpec
from fleettune.results import TrialRecord
from fleettune_dev.bench.load import (
    NAMESPACE,
    CpuSampler,
    Observer,
    PodTimes,
    Reaction,
    Report,
    audit,
    bench_fleet,
    cpu_jiffies,
    gpu_busy_seconds,
    gpu_utilisation,
    idle_breakdown,
    job_controller_delays,
    job_trials,
    main,
    pod_waits,
    quantile,
    reaction_latencies,
    reactions_by_load,
    revision,
    run_manifests,
    termination_message,
    trials_per_pod,
    utilisation,
)
from fleettune_job.protocol import TRIAL_ENV, Answer, Batch, BatchResult, Outcome


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
    assert all(TuningRunSpec.model_validate(d["spec"]).budget.trials_per_pod == 1 for d in docs)
    batched = run_manifests(fleet, runs=4, trials=240, parallelism=3, strategy="random", trials_per_pod=8)
    assert all(TuningRunSpec.model_validate(d["spec"]).budget.trials_per_pod == 8 for d in batched)


def test_trials_per_pod_is_checked_against_the_protocols_limit(capsys):
    assert trials_per_pod("1") == 1 and trials_per_pod("48") == 48
    for bad in ("0", "49", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            trials_per_pod(bad)
    with pytest.raises(SystemExit):
        main(["--trials-per-pod", "64"])
    assert "--trials-per-pod" in capsys.readouterr().err


def _finished_pod(message: str | None) -> dict:
    terminated = {"exitCode": 0} | ({"message": message} if message is not None else {})
    return {"status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"message": "not mine"}}},
        {"name": "trial", "state": {"terminated": terminated}}]}}


def test_gpu_busy_time_is_read_from_the_pods_result():
    batch = BatchResult(answers=[Answer(i=0, o=Outcome.OK, t=0.5, c=0.85, r=0.25),
                                 Answer(i=1, o=Outcome.COMPILE_ERROR, c=0.4),
                                 Answer(i=2, o=Outcome.OK, t=0.7, r=0.5)], done=True).encode()
    assert termination_message(_finished_pod(batch)) == batch
    assert termination_message({"status": {"phase": "Running"}}) is None
    assert gpu_busy_seconds(batch) == pytest.approx(0.75)
    assert gpu_busy_seconds(BatchResult(answers=[Answer(i=0, o=Outcome.COMPILE_ERROR)]).encode()) == 0.0
    for unreadable in (None, "", "{", '{"version": 2}'):
        assert gpu_busy_seconds(unreadable) is None


def test_gpu_utilisation_is_busy_time_over_the_time_pods_held_their_gpu():
    pods = {
        # Bound at 0, running 1-10: held 10 s, 2 s of GPU work.
        "a": PodTimes("r", "p", started=1.0, finished=10.0, created=0.0, bound=0.0, gpu_busy_s=2.0),
        "b": PodTimes("r", "p", started=0.0, finished=5.0, gpu_busy_s=3.0),  # held 5 s
        "c": PodTimes("r", "p", started=0.0, finished=5.0),  # no readable result: left out
        "d": PodTimes("r", "p", started=0.0, finished=None, gpu_busy_s=None),  # still running
    }
    assert gpu_utilisation(pods) == pytest.approx((5.0, 15.0, 1 / 3))
    assert math.isnan(gpu_utilisation({})[2])


def test_the_report_shows_requests_per_evaluation_and_gpu_utilisation():
    report = Report(gpus=24, pools=3, runs=4, budget_per_target=20, parallelism=3, strategy="random",
                    trial_seconds=4.0, trials_per_pod=8, pod_startup=True, evaluations=240,
                    api_requests_per_evaluation=3.25, gpu_busy_s=12.0, gpu_allocated_s=600.0, gpu_utilisation=0.02)
    text = report.render()
    assert "8 per Pod, Pod start-up modelled" in text
    assert "3.2 per evaluation (240 evaluations)" in text
    assert "GPU utilisation:     2.00% (evaluations' GPU time 12 s of 600 s held by trial Pods)" in text


def test_reaction_latency_pairs_each_end_with_the_next_job_of_its_run_and_pool():
    pods = {
        "a": PodTimes("r1", "a100", 0.0, 10.0),
        "b": PodTimes("r1", "a100", 0.0, 10.5),
        "c": PodTimes("r1", "a100", 11.0, 20.0),  # last one: no next Job
        "d": PodTimes("r2", "a100", 0.0, 10.0),  # another run's Jobs do not count
    }
    jobs = {"j0": ("r1", "a100", 0.0, None), "j1": ("r1", "a100", 10.2, None), "j2": ("r1", "a100", 11.5, None),
            "k0": ("r2", "a100", 0.0, None), "k1": ("r2", "a100", 13.0, None)}
    lat = reaction_latencies(pods, jobs)
    assert sorted(round(r.seconds, 3) for r in lat["a100"]) == [0.2, 1.0, 3.0]


def test_reaction_latency_follows_the_apiservers_order_not_when_the_watches_saw_it():
    # The operator answered each end within 0.1 s, but the bench's Pod watch lagged 0.3 s
    # behind its Job watch: by sight, each Job came before the end it answers.
    ends = [(10.3, 100), (20.3, 200), (30.3, 300)]
    pods = {f"p{i}": PodTimes("r", "a100", 0.0, seen, finished_rv=rv) for i, (seen, rv) in enumerate(ends)}
    jobs = {"j0": ("r", "a100", 0.0, 1), **{f"j{i + 1}": ("r", "a100", seen - 0.2, rv + 5)
                                            for i, (seen, rv) in enumerate(ends)}}
    assert [r.seconds for r in reaction_latencies(pods, jobs)["a100"]] == [0.0, 0.0, 0.0]
    # By sight alone (no resourceVersions), each end is paired with the next end's Job.
    blind = {k: (*v[:3], None) for k, v in jobs.items()}
    assert [round(r.seconds, 3) for r in reaction_latencies(pods, blind)["a100"]] == [9.8, 9.8]
    assert revision({"resourceVersion": "123"}) == 123 and revision({}) is None


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


def _job(env: str, first: int) -> dict:
    return {"metadata": {"labels": {"fleettune.dev/trial": str(first)}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "trial", "env": [{"name": "HOME", "value": "/tmp"}, {"name": TRIAL_ENV, "value": env}]}]}}}}


def test_a_jobs_trials_are_read_from_its_work():
    common = {"run": "r", "target": "a100", "kernel": {"builtin": "convolution"}, "problem_size": [64]}
    one = Batch(entries=[{"index": 3, "config": {}}], **common).to_env()
    batch = Batch(entries=[{"index": i, "config": {"x": i}} for i in (7, 8, 9)], **common).to_env()
    assert job_trials(_job(one, 3)) == [3]
    assert job_trials(_job(batch, 7)) == [7, 8, 9]
    assert job_trials(_job("{garbled", 5)) == [5]


def test_machine_cpu_is_read_from_proc_stat_without_idle_and_iowait():
    stat = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\n"
    assert cpu_jiffies(stat) == (160, 1000)
    busy, total = cpu_jiffies()  # this machine's: counters only grow
    assert 0 <= busy <= total


def test_reactions_are_split_by_whether_the_machine_was_saturated_meanwhile():
    cpu = CpuSampler(interval=1.0, samples=[(0.0, 1.0, 0.4), (1.0, 2.0, 1.0), (2.0, 3.0, 0.98), (3.0, 4.0, 0.5)])
    assert cpu.busy(0.5, 1.5) == pytest.approx(0.7)
    assert math.isnan(cpu.busy(10.0, 11.0))
    split = reactions_by_load([Reaction(1.0, 2.0), Reaction(0.0, 0.2), Reaction(2.5, 0.1), Reaction(3.0, 0.5)], cpu)
    # 1.0-3.0: 0.99 busy; 0.0-1.0 (one sample at least): 0.4; 2.5-3.5: 0.74; 3.0-4.0: 0.5
    assert split == {"saturated": [2.0], "not saturated": [0.2, 0.1, 0.5]}
