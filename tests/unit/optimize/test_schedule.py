"""When the space-filling design ends, where most of a space fails (pure: `Schedule`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleettune.optimize.problem import History
from fleettune.optimize.schedule import DESIGN_REPLACE, Schedule
from fleettune_job.protocol import Outcome

NONE = np.zeros(0, dtype=np.int64)


def history(outcomes: str) -> History:
    """``outcomes``: one letter per evaluation, ``o`` ran, ``x`` failed."""
    h = History.empty(2, 2)
    for i, c in enumerate(outcomes):
        ok = c == "o"
        h.append(np.zeros(2), np.zeros(2), i, 1.0 + i if ok else math.nan, 0.0,
                 Outcome.OK if ok else Outcome.RUNTIME_ERROR, task=1)
    return h


def designing_until(schedule: Schedule, outcomes: str) -> int:
    """The number of evaluations after which the design hands over to the model."""
    for n in range(len(outcomes) + 1):
        if not schedule.designing(history(outcomes[:n]), NONE):
            return n
    raise AssertionError("still designing")


def test_failed_design_points_are_replaced_up_to_half_the_design_by_default() -> None:
    assert DESIGN_REPLACE == 0.5
    mostly_failing = "xxoxx" * 8  # a fifth of the space runs
    assert designing_until(Schedule(10, 3, 2), mostly_failing) == 15
    assert designing_until(Schedule(10, 3, 2, design_replace=1.0), mostly_failing) == 20
    assert designing_until(Schedule(10, 3, 2), "o" * 20) == 10  # nothing failed: the design's own size
    assert designing_until(Schedule(10, 3, 2), "oxoooooooooooo") == 11  # one failure, replaced


@pytest.mark.parametrize("replace", [0.0, 0.5, 1.0])
def test_the_model_never_leads_on_fewer_than_two_results_that_ran(replace: float) -> None:
    assert designing_until(Schedule(10, 3, 2, design_replace=replace), "x" * 30 + "oo") == 32
