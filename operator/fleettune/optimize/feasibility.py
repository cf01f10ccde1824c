"""Feasibility model for hidden constraints (compile, launch, resource failures).

A GP regression on +/-1 labels (least-squares classification, Rasmussen & Williams
§6.5) squashed through a probit. It reuses the surrogate's exact-GP code and fast
posterior, fits in milliseconds, and, unlike the Dirichlet-GP variant we tried first
(which explained sparse failure clusters away as label noise on the recorded pnpoly
spaces), it learns sharp resource boundaries such as block size x tile size from a
handful of failures. Failures thereby neither get ignored nor faked as slow times:
they only lower the probability of feasibility around them; far from any data the
probability reverts to the observed feasibility rate.
"""

from __future__ import annotations

import numpy as np
import torch

from .gp import Hyper, Posterior, fit_hyper

LINK_VAR = 0.25  # probit scale: a point predicted at exactly -1 gets P(feasible) = Phi(-2) ~ 2%


def labels(feasible: np.ndarray) -> np.ndarray:
    return np.where(feasible, 1.0, -1.0)


def fit_feasibility(x: np.ndarray, feasible: np.ndarray, init: Hyper | None, max_iter: int) -> Hyper:
    # Unit signal variance for +/-1 labels: a free one runs off to huge values with
    # collapsed length-scales, and then every unseen point looks like a coin flip.
    return fit_hyper(
        x, labels(feasible), np.zeros(len(feasible)), init=init, max_iter=max_iter, outputscale_prior=None
    )


class FeasibilityModel:
    """P(configuration runs) at new points."""

    def __init__(self, x: np.ndarray, feasible: np.ndarray, hyper: Hyper) -> None:
        self.gp = Posterior(x, labels(feasible), np.zeros(len(feasible)), hyper)

    def prob(self, xc: np.ndarray | torch.Tensor) -> torch.Tensor:
        mean, var = self.gp.predict(torch.as_tensor(xc))
        return torch.special.ndtr(mean / torch.sqrt(var + LINK_VAR))
