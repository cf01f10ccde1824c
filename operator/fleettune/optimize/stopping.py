"""Stopping rules, as pure functions: one home for when a study, and a pool's round of
tuning, is over.

* `stop_reason`: the study's own view, from its objective trace (budget, target,
  patience, deadline, exhausted candidates).
* `pool_verdict`: the operator's rules for one pool's round, in precedence order:
  infrastructure failures, deadline, budget, a confirmed prediction, the study's
  patience, nothing left to try.
* `confident` and `prediction_confirmed`: ``budget.stopWhenPredicted``, a pool that
  measured the fleet's confident prediction for it first and found nothing better.

A deadline is always a number of seconds since the pool's round of tuning started (the
run's start, or the start of the round a driver change or a retune began), never a time
of day: ``elapsed_s > deadline_s`` ends it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fleettune.names import bounded

Ending = Literal["Succeeded", "Failed"]
INFRA_ERROR_MAX = 400  # characters of the last infrastructure failure quoted in the message
# A fleet prediction (`fleettune.fleetprediction`) is confident when every other GPU, left
# out in turn, got at least this fraction of its optimum from the consensus of the rest:
# the lower bound of its ``expectedFractionRange``, not the mean, so that one GPU the rule
# served badly keeps a pool from stopping on it.
CONFIDENT_FRACTION = 0.9
# Evaluations of the pool besides the predicted configuration that must not beat it before
# the pool stops: as many as a pool's first Pods hold before any result
# (`optimize.batching.FIRST_CONFIGS`), the default configuration among them, so that a
# confirmed pool has at least the spread of a blind first batch of its own behind its
# answer, and stops with most of a default budget (60) unspent.
CONFIRM_TRIALS = 8
# What beating the prediction takes when the strategy sets no ``min_gain`` (bayes does:
# 0.01, about the timing noise of 32 timed runs); a gain within it is noise, not a
# better configuration.
DEFAULT_MIN_GAIN = 0.01


def improvements(values: np.ndarray, gain: float = 0.0) -> np.ndarray:
    """Indices of the evaluations that improved on the best so far by more than the
    fraction ``gain`` of it (``values``: times, lower is better; NaN or inf for failures).

    The reference is the best at the last counted improvement, so a run of small gains
    counts once they add up to ``gain``. With ``gain`` 0 every strict improvement counts.
    """
    out: list[int] = []
    ref = np.inf
    for i, v in enumerate(np.asarray(values, dtype=np.float64)):
        if np.isfinite(v) and v < ref * (1.0 - gain):
            out.append(i)
            ref = v
    return np.array(out, dtype=np.int64)


def stop_reason(
    values: np.ndarray,
    *,
    budget: int | None = None,
    patience: int | None = None,
    target: float | None = None,
    deadline_s: float | None = None,
    elapsed_s: float = 0.0,
    exhausted: bool = False,
) -> str | None:
    """Why a study should stop, or None: "exhausted", "budget", "target", "patience" or
    "deadline", the first that holds in that order.

    ``values`` holds one entry per evaluation of this study, in order, NaN for failures
    (they count as evaluations). ``patience`` K: stop when the last K evaluations did not
    improve the best value (the GPU-embedded seed tuner uses K=5). ``deadline_s``: stop
    once ``elapsed_s``, the seconds since the round started, exceeds it.
    """
    n = len(values)
    if exhausted:
        return "exhausted"
    if budget is not None and n >= budget:
        return "budget"
    finite = np.isfinite(values)
    if target is not None and finite.any() and float(np.nanmin(values)) <= target:
        return "target"
    if patience is not None and n >= patience:
        better = improvements(values)
        last_best = int(better[-1]) if len(better) else -1
        if n - 1 - last_best >= patience:
            return "patience"
    if deadline_s is not None and elapsed_s > deadline_s:
        return "deadline"
    return None


def confident(fraction_range: Sequence[float] | None) -> bool:
    """Whether a prediction's ``expectedFractionRange`` (lowest, highest) is confident:
    its lowest at least CONFIDENT_FRACTION; None (no confidence measured) never is."""
    return fraction_range is not None and len(fraction_range) > 0 and fraction_range[0] >= CONFIDENT_FRACTION


def prediction_confirmed(predicted: float | None, others: Sequence[float], *, gain: float = DEFAULT_MIN_GAIN,
                         confirm: int = CONFIRM_TRIALS) -> bool:
    """Whether a pool's predicted configuration held up: it measured valid (``predicted``:
    its time; None or NaN when it failed or is not measured yet), at least ``confirm`` of
    the pool's other evaluations are in (``others``: their times in any order, NaN for the
    failed ones, which count), and none of them is faster than it by more than the
    fraction ``gain``. One that is stays faster: once beaten, a prediction is never
    confirmed again."""
    if predicted is None or not math.isfinite(predicted) or predicted <= 0 or len(others) < confirm:
        return False
    return not any(math.isfinite(v) and v < predicted * (1.0 - gain) for v in others)


def confirmed_message(key: str, gain: float, more: int) -> str:
    """A pool's message when `prediction_confirmed` ended it."""
    return f"prediction confirmed: {key} measured within {gain * 100:g}% of the best after {more} more trials"


@dataclass(frozen=True)
class Budget:
    """What a pool's round may spend (a TuningRun's ``spec.budget``, field for field)."""

    trials_per_target: int  # observations (infrastructure failures are not)
    max_infra_failures: int  # tolerated; one more fails the pool
    deadline_seconds: int | None = None  # since the round started; None (or 0): no deadline


@dataclass(frozen=True)
class Progress:
    """Where a pool's round stands."""

    observations: int  # finished trials that measured their configuration (failures of it included)
    infra_failures: int  # trial Pods lost to the infrastructure (what budget.maxInfraFailures counts)
    elapsed_s: float  # seconds since the pool's round started
    running: int  # trials still running
    # The study's own reason to stop, `Study.should_stop(patience=budget.patience)` when the
    # budget sets a patience: "patience", or "exhausted" once every candidate was measured.
    study_reason: str | None = None
    exhausted: bool = False  # the study had nothing left to suggest (see `pool_verdict`)
    last_infra_error: str = ""  # the last infrastructure failure's error, quoted when they fail the pool
    # Trials those Pods did not measure: the status's ``infraFailed`` (a batch Pod that died
    # loses every configuration it had not answered). None: one per failure.
    infra_trials: int | None = None
    # The pool's message when it measured its predicted configuration and nothing beat it
    # (`prediction_confirmed`, `confirmed_message`; budget.stopWhenPredicted), else None.
    confirmed: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A pool's round is over, or winding down: start no new trial.

    ``phase`` is the pool's final phase, or None while it waits for its running trials
    (the study asked to stop, the trials started before still count); ``stop_running``:
    delete the trials still running (their results would overspend the budget or come
    too late).
    """

    phase: Ending | None
    message: str
    stop_running: bool

    @property
    def final(self) -> bool:
        return self.phase is not None


def infra_message(pods: int, trials: int | None, tolerated: int) -> str:
    """Why infrastructure failures failed a pool, in the numbers its status shows: the rule
    counts trial Pods, the status's ``infraFailed`` the trials they lost; when a batch Pod
    lost several, the message gives both, so it never disagrees with the counter."""
    if trials is None or trials == pods:
        return f"{pods} infrastructure failures (budget.maxInfraFailures={tolerated})"
    return (f"{pods} trial Pods lost to the infrastructure (budget.maxInfraFailures={tolerated}), "
            f"{trials} trials unmeasured (infraFailed={trials})")


def pool_verdict(budget: Budget, progress: Progress) -> Verdict | None:
    """Whether a pool's round ends now, and how; None: it goes on (suggest more trials).

    The rules, the first that holds wins:

    1. more infrastructure failures than ``max_infra_failures``: Failed, running trials deleted;
    2. ``elapsed_s`` past ``deadline_seconds``: Succeeded, running trials deleted;
    3. ``trials_per_target`` observations: Succeeded ("budget spent"), running trials deleted;
    4. a confirmed prediction (``confirmed``): Succeeded once no trial runs; until then no new
       trial, and a running trial that beats the prediction lets the pool tune on;
    5. the study's reason to stop (patience): Succeeded once no trial runs; until then no new trial;
    6. nothing left to suggest and no trial running: Succeeded ("search space exhausted").

    ``exhausted`` is known only after asking the study: call with False before suggesting,
    and again with True when the suggestion came back empty.
    """
    p = progress
    if p.infra_failures > budget.max_infra_failures:
        # The cause is in the Pods' results, which are gone with their Jobs: say it here.
        last = f"; the last: {bounded(p.last_infra_error, INFRA_ERROR_MAX)}" if p.last_infra_error else ""
        return Verdict("Failed", infra_message(p.infra_failures, p.infra_trials, budget.max_infra_failures) + last,
                       stop_running=True)
    if budget.deadline_seconds and p.elapsed_s > budget.deadline_seconds:
        return Verdict("Succeeded", f"deadline reached (budget.deadlineSeconds={budget.deadline_seconds})", True)
    if p.observations >= budget.trials_per_target:
        # Reached (or lowered below) the budget: trials still running would only overspend it.
        return Verdict("Succeeded", "budget spent", stop_running=True)
    if p.confirmed:
        return Verdict(None if p.running else "Succeeded", p.confirmed, stop_running=False)
    if p.study_reason:
        return Verdict(None if p.running else "Succeeded", p.study_reason, stop_running=False)
    if p.exhausted and not p.running:
        return Verdict("Succeeded", "search space exhausted", stop_running=False)
    return None
