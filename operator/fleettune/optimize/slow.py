"""The slow regime of a Bayesian study: the configurations that run many times slower
than its best, and the data of the classifier that learns where they lie.

`SlowRegime.labels(history)` says, for this study's own measured candidates, which are
within ``ratio`` of its best, once enough of them are not (`SLOW_SHARE` of the results
and at least `SLOW_LEAST`; else None, and no classifier); `SlowRegime.inputs(idx)` are
the classifier's inputs of candidates ``idx``: the feasibility model's features plus
the odd part of each integer size (`features.FeatureMap.odd_parts`). Both are functions of
the history and the candidates alone, so a study rebuilt from its stored history fits
the same classifier. `surrogate.Surrogate` fits it (its chain of fits `surrogate.SLOW`)
and the acquisition weighs P(not that slow) as it weighs P(feasible).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .problem import Candidates, History

# Measured configurations more than this many times slower than the study's best are a
# regime of their own (``slow_ratio``; 0: never): once `SLOW_SHARE` of its results (and
# `SLOW_LEAST`) are, a second classifier learns where they lie, from the feasibility
# model's inputs plus the odd part of each integer size, and the acquisition weighs
# P(not that slow) as it weighs P(feasible). On AMD GPUs most convolution_milo
# configurations (a tile of 3, a block width of 48) run 30-100 times slower than the best;
# on the NVIDIA recordings no regime that slow exists and nothing changes.
SLOW_RATIO = 20.0
SLOW_SHARE = 0.1  # SLOW_RATIO: the classifier is fitted once this share of the results is that slow...
SLOW_LEAST = 3  # ...and at least this many: a few outliers are not a regime


class SlowRegime:
    """Which of a study's results are in the slow regime, and the inputs of the classifier
    that learns it.

    ``features(idx, feas)``: model inputs of candidates ``idx`` as a tensor (the
    feasibility features with ``feas``); ``ratio``: times slower than the best that make
    a result slow (0: never a regime)."""

    def __init__(self, candidates: Candidates, features: Callable[..., torch.Tensor], ratio: float) -> None:
        self.candidates = candidates
        self._features = features
        self.ratio = ratio

    def labels(self, history: History) -> tuple[np.ndarray, np.ndarray] | None:
        """This study's measured candidates and whether each is within ``ratio`` of its
        best; None while too few are slower to call it a regime (or the knob is off)."""
        ratio = self.ratio
        own = np.flatnonzero(history.feasible & (history.task == 1) & (history.cand >= 0))
        if ratio <= 0 or len(own) < 2:
            return None
        value = history.value[own]
        fast = value <= ratio * value.min()
        slow = int((~fast).sum())
        if slow < max(SLOW_LEAST, SLOW_SHARE * len(own)):
            return None
        return history.cand[own].astype(np.int64), fast

    def inputs(self, idx: np.ndarray, xf: torch.Tensor | None = None) -> torch.Tensor:
        """The slow-regime classifier's inputs of candidates ``idx``: their feasibility
        features (``xf`` when the caller has them) plus the odd parts of their sizes."""
        xf = self._features(idx, feas=True) if xf is None else xf
        fn = self.candidates.features
        odd = fn.odd_parts(self.candidates.rows[idx]) if fn is not None else np.zeros((len(idx), 0))
        return torch.cat([xf, torch.from_numpy(odd).to(xf.dtype)], dim=1) if odd.shape[1] else xf
