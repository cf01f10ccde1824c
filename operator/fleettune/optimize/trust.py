"""How much a warm study's model leans on its prior data, earned from the study's own
results: `PriorTrust.weight` maps the prior's predictions at this pool's measured points
and what this pool measured there to a weight in [0, 1] (see the class's doc).
`warm.WarmStart` scales the prior GP's part of the residual model by it, and below
`warm.SKIP_FIRST_PICKS_BELOW` stops measuring the prior's picks. A function of the two arrays
alone, so that a study rebuilt from its history weighs the prior the same.

Why checked rather than trusted, and the measurements behind these values: see
docs/decisions.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PriorTrust:
    """How much a warm study's model leans on the prior, earned from the study's own
    results (a prior from another GPU can be wrong, or the reverse of right).

    `weight(prior, own)` takes, for this pool's observations in the order measured, the
    prior's prediction (log time, or any monotone scale of it) and the measured log
    times (+inf where the configuration failed here), and returns a weight in [0, 1]:
    1 while fewer than ``min_points`` are measured (nothing to judge by yet); 0 when no
    more than the fraction ``runs`` of them ran; 1 while fewer than ``min_points`` ran;
    otherwise an optimistic bound on the Spearman rank correlation of the ones that ran,
    ``rho`` plus ``slack`` standard errors (Fisher z, 1.03 / sqrt(n - 3)), divided by
    ``agree`` and clipped. A prior that orders this pool's measurements the other way
    loses its weight within a few points; one that agrees keeps it.

    Optimistic, because the points a warm study measures first are the ones the prior
    rates best: within so narrow a range of predictions even a prior that carries over
    well (the recorded GEMM and convolution pairs) ranks them little better than by
    chance, so a disagreement must be clear before it costs the prior its weight.
    Deterministic, and cheap: one rank correlation of at most a few hundred points.
    """

    min_points: int = 5
    agree: float = 0.3
    slack: float = 1.0
    runs: float = 0.25

    def weight(self, prior: np.ndarray, own: np.ndarray) -> float:
        prior, own = np.asarray(prior, dtype=np.float64), np.asarray(own, dtype=np.float64)
        n = len(own)
        if n < max(self.min_points, 4):
            return 1.0
        ran = np.isfinite(own)
        if ran.mean() <= self.runs:
            return 0.0  # most of what the prior pointed to fails here
        # Failures stay out of the ranking: where a configuration fails says little about
        # how fast it would be (the fastest often sit next to a resource limit).
        prior, own = prior[ran], own[ran]
        n = len(own)
        if n < max(self.min_points, 4):
            return 1.0
        if np.ptp(prior) <= 0 or np.ptp(own) <= 0:
            return 1.0  # ties everywhere: no ranking to disagree with
        from scipy.stats import spearmanr  # as surrogate.standardise: scipy only where it is used

        rho = float(spearmanr(prior, own)[0])
        if not math.isfinite(rho):
            return 1.0
        z = math.atanh(min(max(rho, -0.999999), 0.999999)) + self.slack * 1.03 / math.sqrt(n - 3)
        return float(min(1.0, max(0.0, math.tanh(z) / self.agree)))
