"""Feasibility model for hidden constraints (compile, launch, resource failures).

Dirichlet-based GP classification (Milios et al., NeurIPS 2018): each class label is
turned into a regression target with a heteroskedastic noise, so the classifier is two
exact GPs that share the fast posterior code of the surrogate, instead of a slow
variational or Laplace fit. Failures are thereby neither ignored nor faked as slow times:
they only lower the probability of feasibility around them.
"""

from __future__ import annotations

import numpy as np
import torch

from .acquisition import prob_feasible
from .gp import Hyper, Posterior, fit_hyper

ALPHA_EPS = 0.01  # pseudo-count of the class a point does not belong to


def dirichlet_targets(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Targets and noise variances of the GP for the class "1" given 0/1 labels."""
    alpha = ALPHA_EPS + labels.astype(np.float64)
    noise = np.log(1.0 / alpha + 1.0)
    return np.log(alpha) - 0.5 * noise, noise


_T1, _N1 = dirichlet_targets(np.array([1]))
_T0, _N0 = dirichlet_targets(np.array([0]))
_SPREAD = float(_T1[0] - _T0[0])
_CENTER = float(0.5 * (_T1[0] + _T0[0]))


def _scaled(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Centred and scaled to unit spread, so the surrogate's hyperparameter priors apply.
    t, n = dirichlet_targets(labels)
    return (t - _CENTER) / _SPREAD, n / _SPREAD**2


def fit_feasibility(x: np.ndarray, feasible: np.ndarray, init: Hyper | None, max_iter: int) -> Hyper:
    t, n = _scaled(feasible.astype(np.int64))
    return fit_hyper(x, t, n, init=init, max_iter=max_iter)


class FeasibilityModel:
    """P(configuration runs) at new points; the two class GPs share hyperparameters."""

    def __init__(self, x: np.ndarray, feasible: np.ndarray, hyper: Hyper) -> None:
        labels = feasible.astype(np.int64)
        t1, n1 = _scaled(labels)
        t0, n0 = _scaled(1 - labels)
        # The "infeasible" GP sees the mirrored targets, hence the mirrored prior mean.
        self.gp1 = Posterior(x, t1, n1, hyper)
        self.gp0 = Posterior(x, t0, n0, Hyper(hyper.lengthscale, hyper.outputscale, -hyper.mean, hyper.noise))

    def prob(self, xc: np.ndarray | torch.Tensor) -> torch.Tensor:
        xc = torch.as_tensor(xc)
        out = []
        for s in range(0, xc.shape[0], 8192):
            part = xc[s : s + 8192]
            ks = self.gp1.cross(part)  # same kernel for both classes: one cross matrix
            m1 = self.gp1.hyper.mean + ks @ self.gp1.alpha
            m0 = self.gp0.hyper.mean + ks @ self.gp0.alpha
            k32 = ks.to(torch.float32)
            v1 = self.gp1.s2 - ((k32 @ self.gp1._k_inv32) * k32).sum(-1).to(torch.float64)
            v0 = self.gp0.s2 - ((k32 @ self.gp0._k_inv32) * k32).sum(-1).to(torch.float64)
            d_var = (v1.clamp_min(0) + v0.clamp_min(0)) * _SPREAD**2
            out.append(prob_feasible((m1 - m0) * _SPREAD, d_var))
        return torch.cat(out)


def log_prob_floor(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p.clamp_min(1e-12))
