"""Stopping rules, as pure functions of the objective trace."""

from __future__ import annotations

import time

import numpy as np


def stop_reason(
    values: np.ndarray,
    *,
    budget: int | None = None,
    patience: int | None = None,
    target: float | None = None,
    deadline: float | None = None,
    exhausted: bool = False,
    now: float | None = None,
) -> str | None:
    """Why a study should stop, or None.

    ``values`` holds one entry per evaluation of this study, in order, NaN for failures
    (they count as evaluations). ``patience`` K: stop when the last K evaluations did not
    improve the best value (the GPU-embedded seed tuner uses K=5). ``deadline`` is a
    wall-clock time (seconds since the epoch).
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
        if not finite.any():
            last_best = -1
        else:
            trace = np.where(finite, values, np.inf)
            # first index at which the final best value was reached
            last_best = int(np.argmax(np.minimum.accumulate(trace) <= trace.min()))
        if n - 1 - last_best >= patience:
            return "patience"
    if deadline is not None and (time.time() if now is None else now) >= deadline:
        return "deadline"
    return None
