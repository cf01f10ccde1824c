"""Batched trial Pods driven through whole runs with no API server: sizes, budgets, and a
Pod that dies mid-batch (tests/unit/controller/fleet_double.py plays the cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from fleet_double import FakeFleet
from test_planner import DEFAULT, SPEC, timed

from fleettune.jobs import entries_of, work_of
from fleettune.optimize.batching import FIRST_CONFIGS
from fleettune_job.protocol import Outcome, TrialResult


def gpu_timed(seconds: float) -> Any:
    """`timed`, with the GPU time the job reports for each configuration."""
    def measure(config: dict[str, Any]) -> TrialResult:
        result = timed(config)
        return result.model_copy(update={"run_s": seconds}) if result.outcome == Outcome.OK else result
    return measure


def fleet(measure: Any = timed, **budget: Any) -> FakeFleet:
    return FakeFleet(spec={**SPEC, "budget": {**SPEC["budget"], **budget}}, measure=measure)


def run(f: FakeFleet, steps: int = 60, **finish: Any) -> list[list[int]]:
    """Step the run to its end; the batch sizes of the Jobs it created, per step."""
    sizes = []
    for _ in range(steps):
        plan = f.step()
        sizes.append([len(entries_of(j)) for j in plan.create])
        if plan.finished:
            return sizes
        f.finish(**finish)
        f.advance(5)
    raise AssertionError("the run did not finish")


def test_fixed_batches_spend_the_budget_exactly_after_the_default_alone() -> None:
    f = fleet(trialsPerTarget=20, parallelism=2, trialsPerPod=4)
    sizes = run(f)
    assert sizes[0] == [1, 4]  # the baseline alone, a batch beside it (random search: no ramp)
    assert max(max(s, default=0) for s in sizes) == 4
    records = f.records_of()
    assert records[0].config == DEFAULT
    assert sum(r.is_observation for r in records) == 20
    assert len({r.index for r in records}) == len(records)  # one record per trial, none twice
    assert len(f.created) < 20  # fewer Pods than trials
    assert f.target()["trialsPerPod"] == 4


def test_a_learning_strategys_pods_ramp_up_with_its_results() -> None:
    f = FakeFleet(spec={**SPEC, "strategy": {"name": "genetic", "seed": 3},
                        "budget": {**SPEC["budget"], "trialsPerTarget": 30, "parallelism": 2, "trialsPerPod": 4}},
                  measure=timed)
    sizes = run(f)
    # The baseline alone, and one more beside it: nothing is measured yet. Then never more
    # outstanding than half the results (`slow_start`), up to the size asked for.
    assert sizes[0] == [1, 1]
    observed = 0
    for step in sizes:  # `run` finishes every Pod before the next step
        outstanding = 0
        for k in step:  # at least one each, so that every free GPU gets work
            assert k <= max(1, observed // 2 - outstanding), (step, observed)
            outstanding += k
        observed += outstanding
    assert max(max(s, default=0) for s in sizes) == 4
    assert sum(r.is_observation for r in f.records_of()) == 30
    assert f.target()["trialsPerPod"] == 4  # the size the Pods aim at

    # A size the operator chooses keeps the pool within MAX_OUTSTANDING already: no ramp.
    f = FakeFleet(spec={**SPEC, "strategy": {"name": "genetic", "seed": 3},
                        "budget": {**SPEC["budget"], "trialsPerTarget": 30, "parallelism": 2, "podSeconds": 20}},
                  measure=gpu_timed(2.0))
    sizes = run(f)
    # Nothing measured: the first blind picks over the two Pods (the default in the first);
    # then 20 s / 2 s, capped for a 2 s start-up: 5.
    assert sizes[0] == [FIRST_CONFIGS // 2] * 2 and sizes[1] == [5, 5]


def test_chosen_batches_aim_at_the_pod_duration_from_the_first_measurements() -> None:
    f = fleet(measure=gpu_timed(2.0), trialsPerTarget=40, parallelism=2, podSeconds=20)
    sizes = run(f)
    assert sizes[0] == [FIRST_CONFIGS // 2] * 2  # nothing measured yet: the first blind picks
    assert f.records_of()[0].config == DEFAULT  # the baseline first, in the first Pod
    later = [k for s in sizes[2:] for k in s]
    assert later and max(later) > 1 and max(later) <= 16
    assert sum(r.is_observation for r in f.records_of()) == 40


def test_one_trial_per_pod_keeps_todays_jobs() -> None:
    f = fleet(measure=gpu_timed(0.5), trialsPerTarget=8, trialsPerPod=1)
    sizes = run(f)
    assert {k for s in sizes for k in s} == {1}
    assert len(f.created) == 8


def test_a_pod_killed_mid_batch_keeps_its_answers_and_records_nothing_invalid() -> None:
    f = fleet(trialsPerTarget=20, parallelism=1, trialsPerPod=5, maxInfraFailures=3)
    for _ in range(10):  # the default alone, then Pods ramping up to five configurations
        f.step()
        (job,) = f.running()
        if len(batch := entries_of(job)) == 5:
            break
        f.finish()
        f.advance(5)
    assert len(batch) == 5
    f.finish(answered=2)  # evicted after two answers
    f.advance(5)
    f.step()
    records = {r.index: r for r in f.records_of()}
    answered, lost = batch[:2], batch[2:]
    assert all(records[i].outcome == timed(c).outcome for i, c in answered)
    assert all(records[i].outcome == Outcome.INFRA_ERROR and "not measured" in records[i].error for i, _ in lost)
    # One Pod lost is one infrastructure failure, not three: the pool keeps tuning.
    assert f.target()["phase"] == "Running"
    sizes = run(f)
    assert sum(r.is_observation for r in f.records_of()) == 20
    assert sizes  # and it finished


def prune_cutoffs(f: FakeFleet) -> list[tuple[float | None, bool, list[float]]]:
    """Step the run to its end: per Job created, its pruning cut-off, whether it holds the
    default configuration, and the times measured before it."""
    out = []
    for _ in range(60):
        plan = f.step()  # records what the Pods answered, then plans
        ok = [r.objective for r in f.records_of() if r.outcome == Outcome.OK and r.objective]
        out += [(work_of(job).prune_above_ms, DEFAULT in [c for _, c in entries_of(job)], ok) for job in plan.create]
        if plan.finished:
            return out
        f.finish()
        f.advance(5)
    raise AssertionError("the run did not finish")


def test_jobs_prune_past_the_pools_best_time_but_never_the_baseline() -> None:
    jobs = prune_cutoffs(fleet(trialsPerTarget=24, parallelism=2, trialsPerPod=4))
    cutoffs = []
    for cutoff, baseline, ok in jobs:
        if baseline or not ok:  # the speed-up's baseline, or nothing measured yet
            assert cutoff is None
        else:
            assert cutoff == 2 * min(ok)  # kernel.pruneSlowerThan's default
            cutoffs.append(cutoff)
    assert len(cutoffs) >= 3 and cutoffs == sorted(cutoffs, reverse=True)  # the best only gets better

    off = FakeFleet(spec={**SPEC, "kernel": {**SPEC["kernel"], "pruneSlowerThan": 0},
                          "budget": {**SPEC["budget"], "trialsPerTarget": 12, "parallelism": 2, "trialsPerPod": 4}},
                    measure=timed)
    assert {cutoff for cutoff, _, _ in prune_cutoffs(off)} == {None}


def batch_running(f: FakeFleet, size: int = 5) -> dict[str, Any]:
    """Step (finishing each Pod) until the one running Pod holds `size` configurations."""
    for _ in range(10):
        f.step()
        (job,) = f.running()
        if len(entries_of(job)) == size:
            return job
        f.finish()
        f.advance(5)
    raise AssertionError(f"no batch of {size}")


def test_answers_a_running_pod_printed_are_learnt_and_shown_before_it_ends_and_stored_once() -> None:
    f = fleet(trialsPerTarget=20, parallelism=1, trialsPerPod=5)
    job = batch_running(f)
    name, batch = job["metadata"]["name"], entries_of(job)
    before = (len(f.store.records), f.target()["completed"])
    printed = f.print_answers(name, 2)
    plan = f.step()
    pool = f.planner.pools["a100"]
    # Learnt and reported now; stored only from the termination message; nothing else started.
    assert {r.index for r in plan.early} == {a.i for a in printed} and not plan.records
    assert {a.i for a in printed} <= pool.observed and not {i for i, _ in batch[2:]} & pool.observed
    assert len(f.store.records) == before[0] and not plan.create and not plan.delete_now
    target = f.target()
    assert target["completed"] == before[1] + 2 and target["running"] == 3
    best = min(r.objective for r in [*f.store.records, *plan.early] if r.objective)
    assert target["best"]["objectiveMs"] == pytest.approx(best)

    observed = len(pool.observed)
    f.finish()
    f.step()
    mine = [r for r in f.records_of() if r.job == name]
    assert sorted(r.index for r in mine) == sorted(i for i, _ in batch)  # each once
    assert len(pool.observed) == observed + 3  # the other three; the printed two not again
    assert sum(r.is_observation for r in f.records_of()) == len(pool.observed)


def test_a_pod_lost_with_its_node_keeps_the_answers_it_printed() -> None:
    f = fleet(trialsPerTarget=20, parallelism=1, trialsPerPod=5, maxInfraFailures=3)
    job = batch_running(f)
    name, batch = job["metadata"]["name"], entries_of(job)
    f.print_answers(name, 2)
    f.step()
    f.lose_node(name)
    f.step()
    records = {r.index: r for r in f.records_of() if r.job == name}
    assert [records[i].outcome for i, _ in batch[:2]] == [timed(c).outcome for _, c in batch[:2]]
    assert [records[i].objective for i, _ in batch[:2]] == [timed(c).objective for _, c in batch[:2]]
    assert all(records[i].outcome == Outcome.INFRA_ERROR for i, _ in batch[2:])


def test_printed_answers_do_not_spend_the_budget_before_they_are_stored() -> None:
    # The default alone, then one Pod of the budget's last five: all five printed, the Pod
    # not ended yet. "Budget spent" would delete it before its records were stored.
    f = fleet(trialsPerTarget=6, parallelism=1, trialsPerPod=5)
    job = batch_running(f)
    f.print_answers(job["metadata"]["name"], 5)
    plan = f.step()
    assert not plan.delete_now and len(plan.early) == 5 and f.target()["phase"] == "Running"
    f.finish()
    f.step()
    assert sum(r.is_observation for r in f.records_of()) == 6
    assert f.target()["phase"] == "Succeeded"


def test_a_pod_stopped_by_the_deadline_keeps_the_answers_it_printed() -> None:
    f = fleet(trialsPerTarget=40, parallelism=1, trialsPerPod=5, deadlineSeconds=100)
    job = batch_running(f)
    name, batch = job["metadata"]["name"], entries_of(job)
    f.print_answers(name, 3)
    f.advance(200)
    plan = f.step()
    assert name in plan.delete_now and f.target()["phase"] == "Succeeded"
    assert sorted(r.index for r in f.records_of() if r.job == name) == sorted(i for i, _ in batch[:3])


def test_a_targets_pods_go_to_its_sizes_that_run_fewest_then_have_fewest_results() -> None:
    from fleettune.controller.batches import share_pods

    assert share_pods(3, [("a", 0, 5), ("b", 0, 2)]) == {"a": 1, "b": 2}
    assert share_pods(2, [("a", 1, 0), ("b", 0, 9), ("c", 0, 3)]) == {"a": 1, "b": 0, "c": 1}
    assert share_pods(4, [("only", 1, 0)]) == {"only": 4}  # one size: the target's parallelism
    # Fewer Pods allowed than run (parallelism lowered): none stopped, none started.
    assert share_pods(2, [("a", 3, 0), ("b", 0, 0)]) == {"a": 3, "b": 0}
