"""Stopping rules, as pure functions: one home for when a study, and a pool's round of
tuning, is over.

* `stop_reason`: the study's own view, from its objective trace (budget, target,
  patience, deadline, exhausted candidates).
* `pool_verdict`: the operator's rules for one pool's round, in precedence order:
  infrastructure failures, deadline, budget, the study's patience, nothing left to try.

A deadline is always a number of seconds since the pool's round of tuning started (the
run's start, or the start of the round a driver change or a retune began), never a time
of day: ``elapsed_s > deadline_s`` ends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from fleettune.names import bounded

Ending = Literal["Succeeded", "Failed"]
INFRA_ERROR_MAX = 400  # characters of the last infrastructure failure quoted in the message


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
    4. the study's reason to stop (patience): Succeeded once no trial runs; until then no new trial;
    5. nothing left to suggest and no trial running: Succeeded ("search space exhausted").

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
    if p.study_reason:
        return Verdict(None if p.running else "Succeeded", p.study_reason, stop_running=False)
    if p.exhausted and not p.running:
        return Verdict("Succeeded", "search space exhausted", stop_running=False)
    return None
