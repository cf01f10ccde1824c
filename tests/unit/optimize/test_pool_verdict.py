"""The rules that end a pool's round (`pool_verdict`): each rule, its message, and the
precedence infrastructure failures > deadline > budget > patience > exhausted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleettune.optimize import Budget, Progress, Verdict, pool_verdict

BUDGET = Budget(trials_per_target=20, max_infra_failures=3, deadline_seconds=600)
GOING = Progress(observations=5, infra_failures=1, elapsed_s=30.0, running=2)


def test_a_round_in_progress_goes_on() -> None:
    assert pool_verdict(BUDGET, GOING) is None
    assert pool_verdict(BUDGET, replace(GOING, infra_failures=3, elapsed_s=600.0, observations=19)) is None
    # Nothing to suggest while trials run: wait for them.
    assert pool_verdict(BUDGET, replace(GOING, exhausted=True)) is None


def test_too_many_infrastructure_failures_fail_the_pool_quoting_the_last() -> None:
    got = pool_verdict(BUDGET, replace(GOING, infra_failures=4))
    assert got == Verdict("Failed", "4 infrastructure failures (budget.maxInfraFailures=3)", stop_running=True)
    got = pool_verdict(BUDGET, replace(GOING, infra_failures=4, last_infra_error="image pull failed"))
    assert got is not None and got.message.endswith("; the last: image pull failed") and got.final
    long = pool_verdict(BUDGET, replace(GOING, infra_failures=4, last_infra_error="x" * 5000))
    assert long is not None and len(long.message) < 500 and "more characters" in long.message
    assert pool_verdict(replace(BUDGET, max_infra_failures=0), replace(GOING, infra_failures=1)) is not None


def test_the_deadline_counts_seconds_since_the_round_started() -> None:
    got = pool_verdict(BUDGET, replace(GOING, elapsed_s=600.5))
    assert got == Verdict("Succeeded", "deadline reached (budget.deadlineSeconds=600)", stop_running=True)
    assert pool_verdict(BUDGET, replace(GOING, elapsed_s=600.0)) is None
    assert pool_verdict(replace(BUDGET, deadline_seconds=None), replace(GOING, elapsed_s=1e9)) is None
    assert pool_verdict(replace(BUDGET, deadline_seconds=0), replace(GOING, elapsed_s=1e9)) is None


def test_a_spent_budget_stops_the_running_trials() -> None:
    for observations in (20, 25):  # reached, or the budget lowered below it
        got = pool_verdict(BUDGET, replace(GOING, observations=observations))
        assert got == Verdict("Succeeded", "budget spent", stop_running=True)


def test_patience_waits_for_the_running_trials() -> None:
    waiting = pool_verdict(BUDGET, replace(GOING, study_reason="patience"))
    assert waiting == Verdict(None, "patience", stop_running=False) and not waiting.final
    done = pool_verdict(BUDGET, replace(GOING, study_reason="patience", running=0))
    assert done == Verdict("Succeeded", "patience", stop_running=False)
    # With a patience, the study also says when it measured every candidate.
    got = pool_verdict(BUDGET, replace(GOING, study_reason="exhausted", running=0))
    assert got == Verdict("Succeeded", "exhausted", stop_running=False)


def test_nothing_left_to_suggest_and_nothing_running() -> None:
    got = pool_verdict(BUDGET, replace(GOING, exhausted=True, running=0))
    assert got == Verdict("Succeeded", "search space exhausted", stop_running=False)


@pytest.mark.parametrize(("progress", "message"), [
    (Progress(observations=20, infra_failures=4, elapsed_s=700, running=1, study_reason="patience", exhausted=True),
     "4 infrastructure failures (budget.maxInfraFailures=3)"),
    (Progress(observations=20, infra_failures=3, elapsed_s=700, running=1, study_reason="patience", exhausted=True),
     "deadline reached (budget.deadlineSeconds=600)"),
    (Progress(observations=20, infra_failures=3, elapsed_s=600, running=0, study_reason="patience", exhausted=True),
     "budget spent"),
    (Progress(observations=19, infra_failures=3, elapsed_s=600, running=0, study_reason="patience", exhausted=True),
     "patience"),
    (Progress(observations=19, infra_failures=3, elapsed_s=600, running=0, exhausted=True),
     "search space exhausted"),
])
def test_precedence(progress: Progress, message: str) -> None:
    got = pool_verdict(BUDGET, progress)
    assert got is not None and got.message == message
