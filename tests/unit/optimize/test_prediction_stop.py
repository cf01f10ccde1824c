"""`budget.stopWhenPredicted`'s pure rules: when a prediction is confident, when it is
confirmed, and where the confirmed prediction stands among a pool's stopping rules."""

from __future__ import annotations

import math
from dataclasses import replace

from fleettune.optimize import Budget, Progress, Verdict, pool_verdict
from fleettune.optimize.stopping import (
    CONFIDENT_FRACTION,
    CONFIRM_TRIALS,
    confident,
    confirmed_message,
    prediction_confirmed,
)

NAN = math.nan


def test_a_prediction_is_confident_when_its_lowest_left_out_fraction_reaches_the_threshold() -> None:
    assert CONFIDENT_FRACTION == 0.9
    assert confident([0.9, 1.0]) and confident((0.97, 0.99))
    assert not confident([0.899, 1.0])  # the mean or the highest does not count
    assert not confident(None) and not confident([])


def test_a_prediction_is_confirmed_once_enough_other_evaluations_did_not_beat_it() -> None:
    assert CONFIRM_TRIALS == 8
    slower = [1.5] * CONFIRM_TRIALS
    assert prediction_confirmed(1.0, slower)
    assert not prediction_confirmed(1.0, slower[:-1])  # one short
    # Failed evaluations count as evaluations that did not beat it.
    assert prediction_confirmed(1.0, [NAN] * 3 + slower[3:])


def test_a_prediction_not_measured_valid_is_never_confirmed() -> None:
    slower = [1.5] * 20
    assert not prediction_confirmed(None, slower)
    assert not prediction_confirmed(NAN, slower)
    assert not prediction_confirmed(0.0, slower)


def test_an_evaluation_faster_by_more_than_the_gain_beats_it_for_good() -> None:
    slower = [1.5] * CONFIRM_TRIALS
    assert not prediction_confirmed(1.0, [*slower, 0.98])
    assert not prediction_confirmed(1.0, [0.98, *slower, *slower])  # first or later, it stays beaten
    # Within the gain (timing noise): still confirmed; gain 0: any faster one beats it.
    assert prediction_confirmed(1.0, [*slower, 0.995])
    assert not prediction_confirmed(1.0, [*slower, 0.995], gain=0.0)
    assert prediction_confirmed(1.0, [*slower, 0.96], gain=0.05)
    assert prediction_confirmed(1.0, [1.0] * CONFIRM_TRIALS, gain=0.0)  # a tie does not beat it
    assert prediction_confirmed(1.0, slower[:3], confirm=3)


def test_the_message_names_the_configuration_the_gain_and_the_trials_after_it() -> None:
    assert confirmed_message("64,4,0", 0.01, 11) == (
        "prediction confirmed: 64,4,0 measured within 1% of the best after 11 more trials")
    assert confirmed_message("x", 0.005, 8).endswith("within 0.5% of the best after 8 more trials")


BUDGET = Budget(trials_per_target=60, max_infra_failures=3, deadline_seconds=600)
GOING = Progress(observations=12, infra_failures=0, elapsed_s=30.0, running=0)
SAID = confirmed_message("64,4,0", 0.01, 11)


def test_a_confirmed_prediction_ends_the_pool_once_its_trials_are_in() -> None:
    assert pool_verdict(BUDGET, GOING) is None
    assert pool_verdict(BUDGET, replace(GOING, confirmed=SAID)) == Verdict("Succeeded", SAID, stop_running=False)
    # Trials running: no new one, and theirs still count (one may beat the prediction).
    assert pool_verdict(BUDGET, replace(GOING, confirmed=SAID, running=2)) == Verdict(None, SAID, False)


def test_a_confirmed_prediction_comes_after_infrastructure_deadline_and_budget_before_patience() -> None:
    confirmed = replace(GOING, confirmed=SAID)
    got = pool_verdict(BUDGET, replace(confirmed, infra_failures=4))
    assert got is not None and got.phase == "Failed"
    got = pool_verdict(BUDGET, replace(confirmed, elapsed_s=601.0))
    assert got is not None and got.message.startswith("deadline reached")
    got = pool_verdict(BUDGET, replace(confirmed, observations=60))
    assert got is not None and got.message == "budget spent"
    got = pool_verdict(BUDGET, replace(confirmed, study_reason="patience", exhausted=True))
    assert got is not None and got.message == SAID
