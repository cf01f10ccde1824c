"""Hyperparameter fits of the Bayesian strategy's models on a schedule of history lengths,
each warm-started from the previous checkpoint's fit.

`FitChain.hyper(history, m, model)` returns ``model``'s hyperparameters as last fitted
at or before history length ``m``: the history's first ``m`` results are refitted at
each checkpoint (`checkpoints`: every time the history grew by the fraction ``growth``;
with ``warm_refit`` and prior data, a schedule of this study's own evaluations after the
prior's), each fit started from the one at the previous checkpoint. The checkpoints are
fixed by the history's length, and the fits by the history's prefixes, so a study rebuilt
from its stored history retraces the same fits and suggests the same. Fits are cached by
(checkpoint, number of prior results, model): a history without its prior (a dropped
prior, a warm study's hedged picks) is another chain.

What a model is fitted on is the caller's: ``fit(prefix, model, init)`` fits ``model``
on the history prefix ``prefix`` starting from ``init`` (None at the first checkpoint)
and returns what holds from this checkpoint on (``init`` itself where the data are too
few to fit; see `surrogate.Surrogate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .gp import Hyper
from .problem import History

# Refit the hyperparameters each time the history grew by this fraction (``refit_growth``):
# a checkpoint schedule fixed by the history's length, so a rebuilt study retraces the fits.
REFIT_GROWTH = 0.25
# Warm start: refit on a schedule of this study's own evaluations (after 1, 2, 3, 4, 6, ...)
# rather than of the history with the prior in it (``warm_refit``).
WARM_REFIT = True

Fit = Callable[[History, str, Hyper | None], Hyper | None]


def checkpoints(m: int, growth: float) -> list[int]:
    """History lengths at which hyperparameters are refitted, up to ``m``."""
    out = [1]
    while True:
        nxt = out[-1] + max(1, math.ceil(out[-1] * growth))
        if nxt > m:
            return out
        out.append(nxt)


class FitChain:
    """The chains of fits of one strategy, one per model name (see the module's doc)."""

    def __init__(self, fit: Fit, *, growth: float, warm_refit: bool) -> None:
        self._fit = fit
        self.growth, self.warm_refit = growth, warm_refit
        self._fits: dict[tuple[int, int, str], Hyper | None] = {}

    def marks(self, history: History, m: int) -> list[int]:
        """History lengths (up to ``m``) at which hyperparameters are refitted."""
        n0 = int((history.task == 0).sum())
        if self.warm_refit and n0 > 0 and m >= n0:
            return [n0 + c - 1 for c in checkpoints(m - n0 + 1, self.growth)]
        return checkpoints(m, self.growth)

    def hyper(self, history: History, m: int, model: str) -> Hyper | None:
        """``model``'s hyperparameters as last fitted at or before history length ``m``;
        None while there was too little to fit."""
        key = (m, int((history.task == 0).sum()), model)
        if key in self._fits:
            return self._fits[key]
        marks = self.marks(history, m)
        prev = marks[-2] if len(marks) > 1 and marks[-1] == m else None
        init = self.hyper(history, prev, model) if prev else None
        self._fits[key] = self._fit(history.prefix(m), model, init)
        return self._fits[key]
