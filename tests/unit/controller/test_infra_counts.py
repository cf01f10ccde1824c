"""A pool failed by the infrastructure says so in the numbers its status shows: the rule
counts trial Pods (budget.maxInfraFailures), the status's ``infraFailed`` the trials they
lost, and a batch Pod loses several; the message gives both, and names the pool."""

from __future__ import annotations

from dataclasses import replace

from test_planner import fleet

from fleettune.optimize import Budget, Progress, pool_verdict
from fleettune_job.protocol import infra_failure

CAUSE = "simulator: pool a100 has no recording or synthetic model for kernel 'gemm'"


def test_the_message_of_a_pool_failed_by_batch_pods_agrees_with_its_counters() -> None:
    f = fleet(lambda config: infra_failure(CAUSE), maxInfraFailures=2)  # Pods of several trials each
    report = f.run()
    t = f.target()
    lost = f.records_of()
    pods = len({r.job for r in lost})
    assert t["infraFailed"] == len(lost) > pods == 3
    assert t["message"] == (f"3 trial Pods lost to the infrastructure (budget.maxInfraFailures=2), "
                            f"{len(lost)} trials unmeasured (infraFailed={len(lost)}); the last: {CAUSE}")
    # The run's message names the pool; its counter is the pools' sum.
    assert report.message == f"a100: {t['message']}"
    assert f.status is not None and f.status["trials"]["infraFailed"] == t["infraFailed"]


def test_with_one_trial_per_pod_the_two_counts_are_one() -> None:
    f = fleet(lambda config: infra_failure(CAUSE), maxInfraFailures=2, trialsPerPod=1, parallelism=1)
    f.run()
    t = f.target()
    assert t["infraFailed"] == 3
    assert t["message"].startswith("3 infrastructure failures (budget.maxInfraFailures=2); the last: ")


def test_the_verdict_counts_pods_and_reports_the_trials_they_lost() -> None:
    budget = Budget(trials_per_target=20, max_infra_failures=10)
    going = Progress(observations=0, infra_failures=11, elapsed_s=1.0, running=0)
    assert pool_verdict(budget, replace(going, infra_trials=11)) == pool_verdict(budget, going)
    verdict = pool_verdict(budget, replace(going, infra_trials=24))
    assert verdict is not None and verdict.phase == "Failed"
    assert verdict.message == ("11 trial Pods lost to the infrastructure (budget.maxInfraFailures=10), "
                               "24 trials unmeasured (infraFailed=24)")
    # Many trials lost in few Pods do not fail the pool: the rule counts Pods.
    assert pool_verdict(budget, replace(going, infra_failures=3, infra_trials=30)) is None
